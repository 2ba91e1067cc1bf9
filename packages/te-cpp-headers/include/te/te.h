/* te C API: everything. Include this, link te_core (CMake: find_package(TECore CONFIG) and
 * target_link_libraries(app TECore::te_core)). */
#ifndef TE_TE_H_
#define TE_TE_H_

#include "te/status.h"
#include "te/log.h"
#include "te/tensor.h"
#include "te/device.h"
#include "te/quantize.h"
#include "te/normalization.h"
#include "te/activation.h"
#include "te/recipe.h"
#include "te/gemm.h"

#endif /* TE_TE_H_ */
