"""Shared scaffolding of the CLI-level test scripts: arguments (--hmla, --workdir, the workdir
made afresh) and a checker that prints one ok/FAIL line per property and sets the exit status."""
import argparse
import os
import shutil
import sys


def parse_args(doc):
    ap = argparse.ArgumentParser(description=doc)
    ap.add_argument("--hmla", required=True, help="path to the hmla binary")
    ap.add_argument("--workdir", required=True)
    a = ap.parse_args()
    shutil.rmtree(a.workdir, ignore_errors=True)
    os.makedirs(a.workdir)
    return a


class Checker:
    def __init__(self):
        self.ok = True

    def __call__(self, name, cond, detail=""):
        self.ok &= bool(cond)
        print(f"{'ok  ' if cond else 'FAIL'} {name} {detail}")

    def exit(self):
        sys.exit(0 if self.ok else 1)
