#pragma once
// A core header that includes the plan layer above it: check_layers.py must refuse it.
#include "plan/plan_builder.hpp"
