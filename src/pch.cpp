// Translation unit that owns the precompiled torch header (see CMakeLists.txt).
#include "pch.h"
