"""Device time per update of K vmapped CartPole PPO runs (PureJaxRL's default config: 4 envs x
128 steps), without the host: PureJaxRL's `jax.vmap(make_train)` of U updates against our
training chunk of U updates (`ours`; `ours_nounroll`: rollout loop not unrolled), the fastest of
3 calls after a warm-up, then a jax.profiler trace of 2 calls each under OUTDIR (summarize with
trace_summary.py). Needs .gpu_ref/ for PureJaxRL (see startup.sh).
    python3 experiments/gpu/seeds_profile.py 256 61 /tmp/prof pjr ours ours_nounroll"""
import sys, time, os
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", ".gpu_ref"))  # PureJaxRL ppo.py (see startup.sh)
import jax
K, U, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]; what = sys.argv[4:]
def timed(name, fn, arg):
    jax.block_until_ready(fn(arg)); ts = []
    for _ in range(3):
        s = time.perf_counter(); jax.block_until_ready(fn(arg)); ts.append(time.perf_counter() - s)
    print(f"{name} K={K} ms/update {1e3 * min(ts) / U:.3f} (times {[round(t,3) for t in ts]})", flush=True)
    jax.profiler.start_trace(f"{OUT}/trace_{name}")
    for _ in range(2): jax.block_until_ready(fn(arg))
    jax.profiler.stop_trace()
if "pjr" in what:
    from ppo import make_train
    config = {"LR": 2.5e-4, "NUM_ENVS": 4, "NUM_STEPS": 128, "TOTAL_TIMESTEPS": U * 512, "UPDATE_EPOCHS": 4,
              "NUM_MINIBATCHES": 4, "GAMMA": 0.99, "GAE_LAMBDA": 0.95, "CLIP_EPS": 0.2, "ENT_COEF": 0.01, "VF_COEF": 0.5,
              "MAX_GRAD_NORM": 0.5, "ACTIVATION": "tanh", "ENV_NAME": "CartPole-v1", "ANNEAL_LR": True, "DEBUG": False}
    keys = jax.random.split(jax.random.PRNGKey(30), K)
    f = jax.jit(jax.vmap(make_train(config))).lower(keys).compile()
    timed("pjr", f, keys)
for variant in [w for w in what if w.startswith("ours")]:
    from jaxrl_mgpu import config as C, chunks, parallel, plan as plan_lib
    if variant == "ours_nounroll":
        from jaxrl_mgpu.algos.ppo import ppo; ppo.GPU_ROLLOUT_UNROLL = 1
    cfg = C.validate(C.from_args(["--config", "cartpole", "--num-envs", "4", "--num-steps", "128", "--num-seeds", str(K),
                                  "--total-timesteps", str(U * 512 * 10), "--devices", "1"]))
    par = parallel.setup(cfg.parallel, 1)
    tr = chunks.Trainer(plan_lib.on_devices(cfg, par))
    st = tr.init_state()
    ch = tr.chunk_fn(U, st)
    state = {"s": st}
    def step(_):
        state["s"], m = ch(state["s"]); return state["s"]
    timed(variant, step, None)
