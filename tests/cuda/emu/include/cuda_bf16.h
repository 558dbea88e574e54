// Stand-in for the CUDA toolkit header in the SIMT emulator build: emulate.h (force-included)
// declares everything hmla uses from it.
#pragma once
