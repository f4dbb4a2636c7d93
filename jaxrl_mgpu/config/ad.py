"""The options of Algorithm Distillation (algos/ad.py, algos/ad_async.py). `Config` takes these
fields from here."""

from __future__ import annotations

import dataclasses

from jaxrl_mgpu.config.declare import (AD, FOR_AD, FOR_AD_DATASET, FOR_AD_STORE, POSITIVE, SOURCE_ALGOS, option)


@dataclasses.dataclass(frozen=True)
class AdOptions:
    # -- AD (--algo ad trains for --num-updates and also uses --lr, --anneal-lr, --max-grad-norm,
    # --precision, --grad-accum and the transformer's options; its context is --n-transit, so
    # --policy and --context-len do not apply) -------------------------------------------------
    dataset: str | None = option(None, "directory of learning histories to distill (written by python -m "
                                       "jaxrl_mgpu.histories --out DIR)", AD, applies=FOR_AD_DATASET, metavar="DIR")
    n_transit: int = option(80, "transitions per training window and in the model's context, across episode "
                                "boundaries (e.g. 80 = 4 DarkRoom episodes)", AD, check=POSITIVE, applies=FOR_AD,
                            state=("ad",))
    ad_batch_size: int = option(128, "windows of n-transit transitions per update, GLOBAL (per device = "
                                     "ad-batch-size / devices)", AD, check=POSITIVE, applies=FOR_AD)
    ad_episode_stride: int = option(1, "keep every k-th episode of each learning history, so a context of n "
                                       "episodes spans k x n episodes of the source's learning", AD, check=POSITIVE,
                                    applies=FOR_AD)
    # (--mode collect|learn: the histories come from the run's store, algos/ad_async.py)
    ad_history_steps: int = option(4000, "--mode collect|learn: environment steps of each source learning history "
                                         "(a multiple of the episode length); the same for collectors and learner",
                                   AD, check=POSITIVE, applies=FOR_AD_STORE)
    ad_history_tasks: int = option(32, "--mode collect: tasks (goals) learned at once, one source learner each, "
                                       "per store shard", AD, check=POSITIVE, applies=FOR_AD_STORE)
    ad_source: str = option("ucb", "--mode collect: exploration of the tabular Q-learning source", AD,
                            choices=SOURCE_ALGOS, applies=FOR_AD_STORE)


# AD's own defaults (config/options.py ALGO_DEFAULTS), as the darkroom-ad preset measured them:
# DarkRoom, the task its histories are of; windows of 8 episodes of every 10th episode of a
# history, so that a context spans the source's learning (with every episode kept, a window
# shows almost no improvement and AD only imitates); Adam at 3e-4, gradients clipped at 1.
AD_DEFAULTS = dict(env="DarkRoom", n_transit=160, ad_episode_stride=10, lr=3e-4, max_grad_norm=1.0)
