"""Issue 73: the two ways a compiled step can reach ale-py's vector environment, timed on the
default device with the same games, threads and random actions (drawn on the device):
- `io_callback`: what envs/atari.py uses (a Python callback into AtariVectorEnv.step);
- `ffi`: ale-py's own `xla()` (a C++ custom call, with GPU and CPU targets);
and the ceiling, `python`: AtariVectorEnv.step in a Python loop with actions made beforehand.
Then a rollout as PPO's (the Nature CNN's actions, 512 wide, on the device, from the frames the
host returns), through the project's own environment (envs/atari.py), its batch stepped whole
(`rollout_whole`, pipeline=false) and in two halves, each simulating while the other's actions
are inferred (`rollout_halves`, vec.scan_halves, the default): how much of the inference the
halves hide. Prints one JSON line per row: env steps/s over about SECONDS after a warm-up.
    python experiments/gpu/atari_interfaces.py GAME ENVS THREADS [SECONDS]
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
from ale_py.vector_env import AtariVectorEnv
from jax.experimental import io_callback

game, n, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
seconds = float(sys.argv[4]) if len(sys.argv) > 4 else 10.0
STEPS = 64  # per compiled call


def make():
    envs = AtariVectorEnv(game, n, num_threads=threads, episodic_life=False, reward_clipping=False)
    envs.reset(seed=np.arange(n))
    return envs


def timed(name, call):
    call()  # compile and warm up
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        calls += 1
    rate = calls * STEPS * n / (time.perf_counter() - start)
    print(json.dumps({"interface": name, "game": game, "envs": n, "threads": threads,
                      "device": str(jax.devices()[0]), "env_steps_per_s": round(rate)}), flush=True)


envs = make()
actions = np.random.default_rng(0).integers(0, envs.single_action_space.n, (STEPS, n)).astype(np.int32)
timed("python", lambda: [envs.step(a) for a in actions])
num_actions = int(envs.single_action_space.n)
envs.close()

envs = make()
shapes = (jax.ShapeDtypeStruct((n, 4, 84, 84), jnp.uint8), jax.ShapeDtypeStruct((n,), jnp.int32))


def host_step(a):
    obs, reward, *_ = envs.step(np.asarray(a))
    return obs, reward.astype(np.int32)


@jax.jit
def callback_loop(key):
    def body(i, carry):
        key, total = carry
        key, k = jax.random.split(key)
        obs, reward = io_callback(host_step, shapes, jax.random.randint(k, (n,), 0, num_actions, jnp.int32))
        return key, total + reward.sum() + obs[:, -1, 0, 0].sum()
    return jax.lax.fori_loop(0, STEPS, body, (key, jnp.int32(0)))[1]


key = jax.random.PRNGKey(0)
timed("io_callback", lambda: callback_loop(key).block_until_ready())
envs.close()

envs = make()
handle, _, xla_step = envs.xla()


@jax.jit
def ffi_loop(handle, key):
    def body(i, carry):
        handle, key, total = carry
        key, k = jax.random.split(key)
        handle, (obs, reward, *_) = xla_step(handle, jax.random.randint(k, (n,), 0, num_actions, jnp.int32))
        return handle, key, total + reward.sum() + obs[:, -1, 0, 0].sum()
    return jax.lax.fori_loop(0, STEPS, body, (handle, key, jnp.int32(0)))


timed("ffi", lambda: ffi_loop(handle, key)[2].block_until_ready())
envs.close()

# -- PPO's rollout through envs/atari.py: the batch whole, and in halves ----------------------
import flax.linen as nn  # noqa: E402

from jaxrl_mgpu import envs as envs_lib  # noqa: E402
from jaxrl_mgpu.envs import atari, vec  # noqa: E402
from jaxrl_mgpu.nets.mlp import NatureConv  # noqa: E402


class Policy(nn.Module):  # the Nature CNN and its 512-wide layer, then the action's logits
    @nn.compact
    def __call__(self, frames):
        return nn.Dense(num_actions)(nn.relu(nn.Dense(512)(NatureConv()(frames))))


net = Policy()
weights = net.init(key, jnp.zeros((1, 4, 84, 84), jnp.uint8))


def act(obs, final_obs, k):  # a sample of the policy's actions, as PPO's rollout draws one
    return jax.random.categorical(k[0, 0], net.apply(weights, obs)), ()


for name, pipeline in (("rollout_whole", "false"), ("rollout_halves", "true")):
    env, env_params = envs_lib.make(f"atari:{atari.task_name(game)}", f"threads={threads},pipeline={pipeline}")
    batch = vec.reset(env, env_params, key, jnp.arange(n))
    keys = jax.random.split(key, STEPS * n * 2).reshape(STEPS, n, 2, -1)

    @jax.jit
    def whole(batch):
        def body(batch, k):
            action, _ = act(batch.obs, batch.obs, k)
            batch, out = vec.step(env, env_params, batch, action, k[:, 1])
            return batch, out.reward.sum()
        return jax.lax.scan(body, batch, keys)

    @jax.jit
    def halves(batch):
        batch, _, _, out = vec.scan_halves(env, env_params, batch, batch.obs, act, keys, keys[:, :, 1])
        return batch, out.reward.sum()

    loop = halves if pipeline == "true" else whole
    state = {"batch": batch}

    def call():
        state["batch"], total = loop(state["batch"])
        jax.block_until_ready(total)
    timed(name, call)
