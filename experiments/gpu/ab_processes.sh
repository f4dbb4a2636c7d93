# Old code against new, each side in its own process, alternated ROUNDS times: "new" is the
# working tree, "old" an untracked copy of an earlier commit's package in ${OLD_DIR:-ab_old},
#   rm -rf ab_old && mkdir ab_old && git archive COMMIT jaxrl_mgpu | tar -x -C ab_old
# (carry it to the GPU machine with the run). The old side runs from inside that folder:
# python -m puts the working directory first on sys.path, ahead of PYTHONPATH, so from the
# repository root ./jaxrl_mgpu would shadow it. Each line names the package that ran.
#   bash experiments/gpu/ab_processes.sh ROUNDS BENCH_ARGS...
rounds=$1; shift
for r in $(seq 0 $((rounds - 1))); do
  for side in new old; do
    dir=.; [ $side = old ] && dir=${OLD_DIR:-ab_old}
    (cd $dir && echo "$side r$r $(python3 -c 'import jaxrl_mgpu; print(jaxrl_mgpu.__file__)')" \
       "$(python3 -m jaxrl_mgpu.bench "$@" 2>&1 | grep -E '^d[0-9]|^bf16 matmul' | tr '\n' ' ')")
  done
done
