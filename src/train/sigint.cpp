// The SIGINT flag a run polls after each step (sigint.h); a handler may only set a sig_atomic_t.
#include "sigint.h"

namespace hmla::train {

namespace {
volatile std::sig_atomic_t g_stop = 0;
void on_sigint(int) { g_stop = 1; }
}  // namespace

SigintCatcher::SigintCatcher() : old_((g_stop = 0, std::signal(SIGINT, on_sigint))) {}
SigintCatcher::~SigintCatcher() { std::signal(SIGINT, old_); }
bool SigintCatcher::stop_requested() const { return g_stop != 0; }

}  // namespace hmla::train
