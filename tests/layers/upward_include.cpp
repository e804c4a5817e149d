// Compiled with the core layer's include root only (tests/CMakeLists.txt): it includes a header
// of the plan layer above core, which that root does not hold, so the build must fail.
#include "plan/plan_builder.hpp"

int main() { return 0; }
