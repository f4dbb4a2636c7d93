"""What the host reads of AD (algos/spec.py): its options, its per-device functions (ad.py) and
its asynchronous learner and history collectors (asynchronous.py); registered as `--algo ad`.
Progress in tokens (transitions the model is trained on), not env steps; its network is AD's
transformer (no --policy); a trained run is evaluated in context (tools/incontext.py)."""

from jaxrl_mgpu.algos.ad import ad, asynchronous
from jaxrl_mgpu.algos.ad.options import OPTIONS
from jaxrl_mgpu.algos.spec import Spec

SPEC = Spec(options=OPTIONS, check=ad.check, algorithm=ad.algorithm, policy=ad.policy,
            steps_per_update=ad.steps_per_update, step_unit=ad.STEP_UNIT,
            console=(("loss", "loss/cross_entropy", ".4f"), ("acc", "loss/accuracy", ".3f")),
            summary=("loss/cross_entropy", "loss/accuracy"), evaluated_by="in-context",
            auto_scale_keeps="--grad-accum, lr and --num-updates as configured, so each update learns from more "
                             "sequences", attention_window=lambda cfg: cfg.n_transit,
            asynchronous=asynchronous.ASYNCHRONOUS)
