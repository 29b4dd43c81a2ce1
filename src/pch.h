// Precompiled header: libtorch is large; compiling it once keeps 2-core builds fast.
#pragma once
#include <torch/torch.h>
