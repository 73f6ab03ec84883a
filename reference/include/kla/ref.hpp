// Umbrella header of the kla reference library (header-only, namespace kla::ref).
#pragma once

#include "kla/ref/chunk.hpp"
#include "kla/ref/decay.hpp"
#include "kla/ref/dual.hpp"
#include "kla/ref/grad.hpp"
#include "kla/ref/grad_chunk.hpp"
#include "kla/ref/normalized_key.hpp"
#include "kla/ref/projection.hpp"
#include "kla/ref/recurrence.hpp"
#include "kla/ref/scalar.hpp"
#include "kla/ref/segment.hpp"
#include "kla/ref/tensor.hpp"
#include "kla/ref/types.hpp"
#include "kla/ref/wy.hpp"
#include "kla/version.hpp"
