"""What the host reads of multi-agent PPO (algos/spec.py): PPO's options, its per-device
functions (mappo.py), and on the progress line per team the return per agent and the game's tags.
`--algo ppo` trains a multi-agent game with it (algos/ppo/spec.py)."""

from jaxrl_mgpu.algos.mappo import mappo
from jaxrl_mgpu.algos.ppo import ppo
from jaxrl_mgpu.algos.ppo.options import OPTIONS
from jaxrl_mgpu.algos.spec import Spec

SPEC = Spec(options=OPTIONS, check=mappo.check, algorithm=mappo.algorithm, policy=mappo.policy, evaluation=mappo.evaluation,
            steps_per_update=mappo.steps_per_update,
            console=ppo.CONSOLE + (("taggers", "taggers/episode_return", ".2f"),
                                   ("runners", "runners/episode_return", ".2f"), ("tags", "tags_per_episode", ".2f")))
