// SIGINT during a run: while a run holds a SigintCatcher, Ctrl-C only asks the run to stop after
// its current step (the step's checkpoint, if due, is not written; the last complete one stays
// intact). The previous handler comes back however the run ends.
#pragma once
#include <csignal>

namespace hmla::train {

class SigintCatcher {
 public:
  SigintCatcher();
  ~SigintCatcher();
  SigintCatcher(const SigintCatcher&) = delete;
  SigintCatcher& operator=(const SigintCatcher&) = delete;
  bool stop_requested() const;

 private:
  void (*old_)(int);
};

}  // namespace hmla::train
