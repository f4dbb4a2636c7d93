"""What the host reads of PPO (algos/spec.py): its options, its per-device functions (ppo.py),
and multi-agent PPO (algos/mappo/) for the multi-agent games; registered as `--algo ppo`."""

from jaxrl_mgpu.algos.mappo.spec import SPEC as MULTI_AGENT
from jaxrl_mgpu.algos.ppo import ppo
from jaxrl_mgpu.algos.ppo.options import OPTIONS
from jaxrl_mgpu.algos.spec import Spec

SPEC = Spec(options=OPTIONS, check=ppo.check, algorithm=ppo.algorithm, policy=ppo.policy,
            steps_per_update=ppo.steps_per_update, console=ppo.CONSOLE, multi_agent=MULTI_AGENT)
