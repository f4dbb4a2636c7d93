"""Algorithm Distillation's options (algos/ad/) and its own defaults. Light: no JAX."""

from __future__ import annotations

import dataclasses

from jaxrl_mgpu.config.declare import POSITIVE, TRANSFORMER, AlgoOptions, Applies, option

GROUP = "ad"
SOURCE_ALGOS = ("ucb", "q")  # exploration of AD's tabular Q-learning source (algos/ad/histories.py)
WITH_MODE_BOTH = Applies("{algos} with --mode both", lambda c: c.mode == "both")
WITH_STORE = Applies("{algos} with --mode learn or collect", lambda c: c.mode != "both")


@dataclasses.dataclass(frozen=True)
class AdOptions:
    # --algo ad trains for --num-updates and also uses --lr, --anneal-lr, --max-grad-norm,
    # --precision, --grad-accum and the transformer's options; its context is --n-transit, so
    # --policy and --context-len do not apply
    GROUPS = {GROUP: "Algorithm Distillation: the dataset, its windows, its collectors' source learners"}
    dataset: str | None = option(None, "directory of learning histories to distill (written by python -m "
                                       "jaxrl_mgpu.histories --out DIR)", GROUP, applies=WITH_MODE_BOTH, metavar="DIR")
    n_transit: int = option(80, "transitions per training window and in the model's context, across episode "
                                "boundaries (e.g. 80 = 4 DarkRoom episodes)", GROUP, check=POSITIVE, state=True)
    ad_batch_size: int = option(128, "windows of n-transit transitions per update, GLOBAL (per device = "
                                     "ad-batch-size / devices)", GROUP, check=POSITIVE)
    ad_episode_stride: int = option(1, "keep every k-th episode of each learning history, so a context of n "
                                       "episodes spans k x n episodes of the source's learning", GROUP, check=POSITIVE)
    ad_history_steps: int = option(4000, "--mode collect|learn: environment steps of each source learning history "
                                         "(a multiple of the episode length); the same for collectors and learner",
                                   GROUP, check=POSITIVE, applies=WITH_STORE)
    ad_history_tasks: int = option(32, "--mode collect: tasks (goals) learned at once, one source learner each, "
                                       "per store shard", GROUP, check=POSITIVE, applies=WITH_STORE)
    ad_source: str = option("ucb", "--mode collect: exploration of the tabular Q-learning source", GROUP,
                            choices=SOURCE_ALGOS, applies=WITH_STORE)


# AD's own defaults (AlgoOptions.defaults), as the darkroom-ad preset measured them:
# DarkRoom, the task its histories are of; windows of 8 episodes of every 10th episode of a
# history, so that a context spans the source's learning (with every episode kept, a window
# shows almost no improvement and AD only imitates); Adam at 3e-4, gradients clipped at 1.
AD_DEFAULTS = dict(env="DarkRoom", n_transit=160, ad_episode_stride=10, lr=3e-4, max_grad_norm=1.0)

OPTIONS = AlgoOptions(fields=AdOptions, defaults=AD_DEFAULTS, uses=("num_updates",) + TRANSFORMER, state=("anneal_lr",),
                      single_run="--algo ad distils one dataset into one model and is not multi-run; run it once per "
                                 "seed", size="ad_batch_size")
