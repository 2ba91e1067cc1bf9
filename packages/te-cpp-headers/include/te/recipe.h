/* te C API: scaling-recipe state updates.
 *
 * Delayed scaling keeps, per quantized tensor role, an amax history and a scale. Quantizations of
 * a step write their amax into history[0]; once per step this update turns the histories into the
 * next step's scales. Run any cross-rank all-reduce (max) of history[0] before calling it. */
#ifndef TE_RECIPE_H_
#define TE_RECIPE_H_

#include "te/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum te_amax_compute_algo {
  TE_AMAX_COMPUTE_MAX = 0,        /* amax = max over the whole history window */
  TE_AMAX_COMPUTE_MOST_RECENT = 1 /* amax = history[0], this step's */
} te_amax_compute_algo;

/* For each i < count: amax_histories[i] is fp32 [L] or [L, N] (L >= 1 steps, N tensors) and
 * scales[i] is fp32 [N] ([1] for a 1-D history). Per column:
 *   amax  = max(history) or history[0] (algo);
 *   scale = (fp8_max * 2^-margin) / amax, kept unchanged if amax is 0, inf or NaN, FLT_MAX if inf;
 *   then the history rolls by one: new[j] = old[j+1], new[L-1] = old[0], and new[0] = 0.
 * One CUDA launch covers many tensors. Histories may differ in L and N; all tensors share one
 * device. */
TE_API te_status te_delayed_scaling_update(te_tensor* amax_histories, te_tensor* scales,
                                           int64_t count, float fp8_max, float margin,
                                           int32_t amax_compute_algo, void* stream);

/* One group of te_delayed_scaling_update_groups: the arguments of one te_delayed_scaling_update
 * call. */
typedef struct te_delayed_scaling_group {
  te_tensor* amax_histories; /* [count] */
  te_tensor* scales;         /* [count] */
  int64_t count;
  float fp8_max;
  float margin;
  int32_t amax_compute_algo;
} te_delayed_scaling_group;

/* te_delayed_scaling_update of every group, in one CUDA launch where the groups hold at most 4
 * histories together (a step's forward E4M3 and backward E5M2 histories of a small model), else
 * one per 48. Every tensor of every group shares one device. */
TE_API te_status te_delayed_scaling_update_groups(const te_delayed_scaling_group* groups,
                                                  int64_t num_groups, void* stream);

/* The checks of te_delayed_scaling_update_groups, without the update, plus one that call leaves
 * out because it costs a sort per call: no two histories or scales of all the groups share a byte
 * (a history listed twice would roll twice in one step). For callers that build their groups once
 * and update every step (te_torch does): call it once, when the groups are made. */
TE_API te_status te_delayed_scaling_check_groups(const te_delayed_scaling_group* groups,
                                                 int64_t num_groups);

/* Where te_delayed_scaling_next_groups takes this step's amaxes and puts the next state, for
 * the te_delayed_scaling_group of the same index. */
typedef struct te_delayed_scaling_next {
  const te_tensor* amaxes;        /* [count] fp32 [N] each (the amax of each column's tensor this
                                     step), or NULL: history[0] already holds them */
  te_tensor* next_amax_histories; /* [count]: the histories' shapes */
  te_tensor* next_scales;         /* [count]: the scales' shapes */
} te_delayed_scaling_next;

/* te_delayed_scaling_update_groups out of place, for callers whose state is immutable (XLA,
 * te_jax): the groups' amax_histories and scales are read, never written. For each history, first
 * history[0] = max(history[0], amaxes[i]) (NaN propagates), then the update above, its result
 * written to next[g].next_amax_histories[i] and next[g].next_scales[i], which must not overlap
 * any input. Same launches as te_delayed_scaling_update_groups. */
TE_API te_status te_delayed_scaling_next_groups(const te_delayed_scaling_group* groups,
                                                const te_delayed_scaling_next* next,
                                                int64_t num_groups, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* TE_RECIPE_H_ */
