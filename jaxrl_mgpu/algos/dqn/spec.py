"""What the host reads of DQN (algos/spec.py): its options, its per-device functions (dqn.py)
and its asynchronous learner and collectors (asynchronous.py); registered as `--algo dqn`."""

from jaxrl_mgpu.algos.dqn import asynchronous, dqn
from jaxrl_mgpu.algos.dqn.options import OPTIONS
from jaxrl_mgpu.algos.replay import AUTO_SCALE_KEEPS, steady_state, steps_per_update
from jaxrl_mgpu.algos.spec import Spec

SPEC = Spec(options=OPTIONS, check=dqn.check, algorithm=dqn.algorithm, policy=dqn.policy,
            steps_per_update=steps_per_update, steady_state=steady_state,
            console=(("td", "loss/td", ".4f"), ("eps", "epsilon", ".3f")), auto_scale_keeps=AUTO_SCALE_KEEPS,
            asynchronous=asynchronous.ASYNCHRONOUS)
