"""Issue 73: the two ways a compiled step can reach ale-py's vector environment, timed on the
default device with the same games, threads and random actions (drawn on the device):
- `io_callback`: what envs/atari.py uses (a Python callback into AtariVectorEnv.step);
- `ffi`: ale-py's own `xla()` (a C++ custom call, with GPU and CPU targets);
and the ceiling, `python`: AtariVectorEnv.step in a Python loop with actions made beforehand.
Prints one JSON line per interface: env steps/s over about SECONDS after a warm-up.
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
