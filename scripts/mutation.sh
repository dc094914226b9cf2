#!/usr/bin/env bash
# Mutation testing of the code that decides what is safe (issue 19), with mutmut 3.x.
#
#   scripts/mutation.sh                 # every target module
#   scripts/mutation.sh spec planner    # some of them (names below)
#   KVLAYOUT_MUTATION_REPORT_ONLY=1 scripts/mutation.sh spec   # only rebuild the table
#   KVLAYOUT_MUTATION_RERUN=1 scripts/mutation.sh spec   # rerun the last run's survivors, current tests
#   KVLAYOUT_MUTATION_RERUN=1 KVLAYOUT_MUTATION_RERUN_TESTS=tests/test_mutants_verify.py scripts/mutation.sh verify
#
# mutmut goes into its own venv (.venv-mutation); the test venv (.venv, made by
# scripts/test.sh) lends it numpy, hypothesis, torch and triton through a .pth line, without
# its editable kvlayout. The sources are staged in $KVLAYOUT_MUTATION_WORK with the backends
# at their import paths (kvlayout/backends/cuda, .../pallas), mutmut runs the fast test subset
# below on every mutant, and the table of killed / survived / equivalent mutants per module is
# written to bench/results/mutation.md and .json. Survivors listed with a reason in
# scripts/mutation_equivalent.txt count as equivalent; every other survivor is a missing test.
set -euo pipefail
# the whole script is one function, read before it runs: editing the file mid-run is safe
main() {
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${KVLAYOUT_MUTATION_VENV:-.venv-mutation}
TEST_VENV=${KVLAYOUT_TEST_VENV:-.venv}
case $TEST_VENV in /*) ;; *) TEST_VENV=$ROOT/$TEST_VENV ;; esac  # the table step runs from $WORK
WORK=${KVLAYOUT_MUTATION_WORK:-/tmp/kvlayout-mutation}
OUT=${KVLAYOUT_MUTATION_OUT:-bench/results}
JOBS=${KVLAYOUT_MUTATION_JOBS:-$(nproc)}

declare -A TARGETS=(
  [spec]=kvlayout/spec.py
  [planner]=kvlayout/planner.py
  [table]=kvlayout/table.py
  [verify]=kvlayout/verify.py
  [reference]=kvlayout/reference.py
  [validate]=kvlayout/validate.py
  [ranges]=kvlayout/ranges.py
  [cuda-plan]=kvlayout/backends/cuda/kernel.py
  [pallas-plan]=kvlayout/backends/pallas/plan.py
  # issue 25: the modules around the core (a target may name several files)
  [native]=kvlayout/native.py
  [sharding]=kvlayout/sharding.py
  [vllm]=kvlayout/integrations/vllm.py
  [cli]=kvlayout/cli.py
  [cuda-zeroer]=kvlayout/backends/cuda/zeroer.py
  [pallas-zeroer]=kvlayout/backends/pallas/zeroer.py
  [pallas-native]=kvlayout/backends/pallas/native.py
  [models]="kvlayout/models/attention.py kvlayout/models/backends.py kvlayout/models/base.py kvlayout/models/build.py kvlayout/models/config.py kvlayout/models/deepseek_v4.py kvlayout/models/entry.py kvlayout/models/families.py kvlayout/models/grouping.py kvlayout/models/hybrid.py kvlayout/models/mla.py kvlayout/models/summary.py kvlayout/models/tpu_inference.py"
  [models-mimo]=kvlayout/models/mimo_v2.py
  [models-gemma4]=kvlayout/models/gemma4.py
  [models-gemma3n]=kvlayout/models/gemma3n.py
)
ORDER=(ranges spec planner table validate reference cuda-plan pallas-plan verify
       native sharding vllm cli cuda-zeroer pallas-zeroer pallas-native models models-mimo models-gemma4 models-gemma3n)
# per module, the fast tests that exercise it (mutmut runs, per mutant, those that reach the function)
declare -A TESTS=(
  [ranges]="tests/test_ranges.py tests/test_table.py"
  [spec]="tests/test_mutants_spec.py tests/test_spec.py tests/test_oracles.py tests/test_regressions_19.py tests/test_layouts.py tests/test_hostile.py tests/test_hostile_s9.py tests/test_hostile_s10.py"
  [planner]="tests/test_mutants_planner.py tests/test_oracles.py tests/test_planner.py tests/test_regressions_19.py tests/test_layouts.py tests/test_mutants_s17_planner.py"
  [table]="tests/test_table.py tests/test_regressions_19.py tests/test_hostile_s8.py tests/test_hostile_s9.py tests/test_hostile_s11.py
           tests/test_hostile_s28.py tests/test_hostile_s24_core.py tests/test_mutants_s34_table.py"
  [validate]="tests/test_validate.py tests/test_reference.py tests/test_mutants_validate.py tests/test_hostile_s8.py tests/test_hostile_s9.py tests/test_hostile_s10.py tests/test_hostile_s11.py tests/test_mutants_s17_validate.py tests/test_hostile_s17.py tests/test_hostile_s19.py tests/test_hostile_s20.py tests/test_hostile_s21.py tests/test_mutants_s22_validate.py
              tests/test_mutants_s27_validate.py tests/test_hostile_s32.py tests/test_hostile_s33.py
              tests/test_mutants_s34_validate.py"
  [reference]="tests/test_reference.py tests/test_mutants_reference.py tests/test_mutants_s17_reference.py tests/test_hostile_s19.py tests/test_hostile_s20.py tests/test_hostile_s21.py tests/test_mutants_s22_reference.py tests/test_hostile_s23.py
               tests/test_hostile_s24_core.py"
  [cuda-plan]="tests/test_host_plans.py"
  [pallas-plan]="tests/test_host_plans.py tests/test_mutants_s17_pallas_plan.py"
  [verify]="tests/test_mutants_verify_s10.py tests/test_mutants_verify_s9.py tests/test_verify.py tests/test_regressions_19.py tests/test_planted_cores.py tests/test_mutants_verify.py tests/test_hostile_s9.py"
  [native]="tests/test_native.py tests/test_mutants_native.py tests/test_reliability_s5.py tests/test_hostile_s8.py tests/test_mutants_s17_native.py
            tests/test_hostile_s24_core.py tests/test_hostile_s28.py tests/test_mutants_s34_native.py"
  [sharding]="tests/test_sharding.py tests/test_mutants_sharding.py tests/test_reliability_s5.py tests/test_hostile_s8.py tests/test_hostile_s9.py tests/test_hostile_s10.py tests/test_hostile_s19.py tests/test_hostile_s20.py tests/test_hostile_s21.py tests/test_mutants_s22_sharding.py tests/test_hostile_s23.py tests/test_hostile_s24.py"
  [vllm]="tests/test_vllm_ground_truth.py tests/test_vllm_hostile.py tests/test_mutants_vllm.py tests/test_reliability_s5.py tests/test_hostile_s15.py tests/test_hostile_s16.py tests/test_mutants_vllm_s16.py tests/test_hostile_s17_vllm.py tests/test_mutants_s23_vllm.py
          tests/test_mutants_s26_vllm.py"
  [cli]="tests/test_mutants_cli.py tests/test_tpu_inference_cli.py tests/test_reliability_s5.py tests/test_hostile_s8.py tests/test_hostile_s9.py tests/test_hostile_s10.py tests/test_mutants_s17_cli.py"
  [cuda-zeroer]="tests/test_cuda_fast_path.py tests/test_mutants_zeroers.py tests/test_mutants_cuda_zeroer.py tests/test_mutants_s17_cuda_zeroer.py tests/test_hostile_s19_zeroers.py tests/test_hostile_s20.py tests/test_hostile_s23.py tests/test_hostile_s24.py tests/test_hostile_s24_core.py tests/test_mutants_s24_cuda_zeroer.py
                 tests/test_mutants_s26_cuda_zeroer.py tests/test_mutants_s27_cuda_zeroer.py tests/test_hostile_s28.py tests/test_hostile_s29.py
                 tests/test_hostile_s30.py tests/test_hostile_s31.py tests/test_mutants_s32_cuda_zeroer.py
                 tests/test_hostile_s32.py tests/test_hostile_s33.py"
  [pallas-zeroer]="tests/test_mutants_pallas_zeroer.py tests/test_mutants_pallas_zeroer_s9.py tests/test_hostile_s8.py tests/test_hostile_s9.py tests/test_hostile_s9_jax.py tests/test_mutants_s17_pallas_zeroer.py tests/test_hostile_s19_zeroers.py tests/test_mutants_s18_pallas_zeroer.py
                   tests/test_hostile_s26.py tests/test_hostile_s32.py tests/test_hostile_s33.py tests/test_mutants_s34_pallas_zeroer.py"
  # the CacheZeroer's host side (tests/test_native_pallas.py, ~50 s, runs every kernel shape: left to CI)
  [pallas-native]="tests/test_mutants_pallas_native.py tests/test_mutants_s17_pallas_native.py tests/test_hostile_s19_zeroers.py tests/test_mutants_s18_pallas_native.py tests/test_hostile_s20.py tests/test_models_mimo_v2.py tests/test_models_gemma3n.py tests/test_models_gemma4.py
                   tests/test_mutants_s26_pallas_native.py"
  [models]="tests/test_mutants_models.py tests/test_mutants_models_hybrid.py tests/test_models_vl.py tests/test_mutants_models_s11.py tests/test_models_gemma4.py tests/test_models_gemma3n.py tests/test_models_mimo_v2.py tests/test_hostile_s12.py tests/test_hostile_s13.py tests/test_models_cov_s13.py tests/test_models_published_s13.py tests/test_models_aliases.py tests/test_mutants_models_s13.py tests/test_models_indexer_s15.py tests/test_models_validation_s16.py tests/test_mutants_models_s16.py tests/test_mutants_s17_models.py"
  [models-mimo]="tests/test_models_mimo_v2.py"
  [models-gemma4]="tests/test_models_gemma4.py tests/test_models_gemma3n.py"
  [models-gemma3n]="tests/test_models_gemma3n.py"
)
# test files that listed tests import (staged beside them, not run: tests/test_models_hybrid_vllm.py's
# tests drive vLLM in a subprocess, which cannot import the staged tree)
declare -A IMPORTED=(
  [reference]="tests/test_models_hybrid_vllm.py tests/test_models_mimo_v2.py tests/test_models_gemma4.py tests/test_models_gemma3n.py"
  [validate]="tests/test_models_hybrid_vllm.py tests/test_models_mimo_v2.py tests/test_models_gemma4.py tests/test_models_gemma3n.py
              tests/test_vllm_hostile.py tests/test_vllm_ground_truth.py tests/test_models_inkling.py tests/test_models.py"
  [sharding]="tests/test_models_hybrid_vllm.py tests/test_models_mimo_v2.py tests/test_models_gemma4.py tests/test_models_gemma3n.py tests/test_vllm_hostile.py tests/test_vllm_ground_truth.py"
  [pallas-native]="tests/test_models_hybrid_vllm.py"
  [pallas-zeroer]="tests/test_models_hybrid_vllm.py tests/test_models_mimo_v2.py tests/test_models_gemma4.py tests/test_models_gemma3n.py
                   tests/test_vllm_hostile.py tests/test_vllm_ground_truth.py tests/test_models_inkling.py tests/test_models.py"
  [cuda-zeroer]="tests/test_models_hybrid_vllm.py tests/test_models_mimo_v2.py tests/test_models_gemma4.py tests/test_models_gemma3n.py tests/test_vllm_hostile.py tests/test_vllm_ground_truth.py
                 tests/test_models_inkling.py tests/test_models.py"
)
# seeds per property test under mutation, as a fraction of the CI count (tests/oracles.py SCALE)
export KVLAYOUT_TEST_SCALE=${KVLAYOUT_TEST_SCALE:-0.3}

names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${ORDER[@]}")
for n in "${names[@]}"; do
  [ -n "${TARGETS[$n]:-}" ] || { echo "unknown target '$n'; valid: ${ORDER[*]}" >&2; exit 2; }
done

[ -x "$TEST_VENV/bin/python" ] || { echo "no test venv at $TEST_VENV: run scripts/test.sh first" >&2; exit 2; }
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check "mutmut==3.8.1" 2>&1 | grep -v '^WARNING: Location' || true
lend=$("$TEST_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
own=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$lend" > "$own/kvlayout_test_venv.pth"

stage_tests() {  # one module's tests and mutmut config into its work folder
  local n=$1 w="$WORK/$1"
  mkdir -p "$w/tests"
  # shellcheck disable=SC2086
  cp tests/__init__.py tests/conftest.py tests/oracles.py ${TESTS[$n]} ${IMPORTED[$n]:-} "$w/tests/"
  # the tests' helper modules (not test files) and fixtures
  find tests -maxdepth 1 -name '*.py' ! -name 'test_*' -exec cp {} "$w/tests/" \;
  [ -d "$w/tests/fixtures" ] || cp -r tests/fixtures "$w/tests/fixtures"
  [ -d "$w/docs" ] || cp -r docs "$w/docs"
  {
    echo '[tool.mutmut]'
    echo 'source_paths = ["kvlayout"]'
    printf 'only_mutate = ['; for f in ${TARGETS[$n]}; do printf '"%s", ' "$f"; done; echo ']'
    printf 'pytest_add_cli_args_test_selection = ['; for t in ${TESTS[$n]}; do printf '"%s", ' "$t"; done; echo ']'
    # the Triton-interpreter refusal test (3 s) checks the cuda zeroer, not the core: left to CI
    echo 'pytest_add_cli_args = ["-p", "no:cacheprovider", "--hypothesis-seed=0", "-x", "-q",' \
      '"--deselect", "tests/test_hostile.py::test_cuda_zeroer_refuses_the_wrapping_table"]'
    echo 'also_copy = ["docs"]'  # tests that pin what the docs say read them
    echo 'use_git_change_detection = false'
    # JAX: a child forked after the parent ran JAX deadlocks in its first computation (XLA's
    # thread pools are not forked), so the parent must stay clean: stats in a child too
    # (validate: tests/test_hostile_s32.py and _s33.py run PallasZeroer / CacheZeroer under the interpreter)
    case $n in pallas-zeroer|pallas-native|cuda-zeroer|validate) echo 'process_isolation = "forkserver"' ;; esac
    echo '[tool.pytest.ini_options]'
    echo 'testpaths = ["tests"]'
  } > "$w/pyproject.toml"
}

keep_results() {  # the status of every mutant, and the diff of each one that was not killed
  local w="$WORK/$1"
  # (a diff already shown is kept: it changes only with the source, and a full run starts afresh)
  # a mutant killed by an earlier run of the same source stays killed: reruns only add tests (and a
  # rerun with another test selection makes mutmut forget the earlier verdicts)
  (cd "$w" && "$ROOT/$VENV/bin/mutmut" results --all true > results.new
   if [ -s results.txt ]; then
     awk -F': ' 'NR == FNR { if ($2 ~ /^(killed|timeout|segfault)$/) dead[$1] = $2; next }
                 { if (($1 in dead) && $2 !~ /^(killed|timeout|segfault)$/) print $1 ": " dead[$1]; else print }' \
       results.txt results.new > results.merged && mv results.merged results.txt && rm results.new
   else
     mv results.new results.txt
   fi
   grep -E ': (survived|no tests|timeout|suspicious)$' results.txt | sed 's/^ *//; s/:.*//' | while read -r m; do
     [ -s "show.$m.txt" ] || "$ROOT/$VENV/bin/mutmut" show "$m" > "show.$m.txt" 2>&1 || true
   done)
}

stage_source() {  # a staged file as mutmut must see it: cuda-zeroer's @plain_torch methods undecorated
  # (mutmut 3.8.1 mutates no decorated function: 577 mutants of the public entries were left out)
  [ "$1" != cuda-zeroer ] || "$TEST_VENV/bin/python" scripts/mutation_undecorate.py "$2"
}

run_one() {  # stage the sources and one module's tests, run mutmut, keep its results
  local n=$1 w="$WORK/$1"
  rm -rf "$w" && mkdir -p "$w"
  cp -r kvlayout "$w/kvlayout"
  rm -rf "$w/kvlayout/backends/cuda" "$w/kvlayout/backends/pallas"
  cp -r backends/cuda "$w/kvlayout/backends/cuda"
  cp -r backends/pallas "$w/kvlayout/backends/pallas"
  stage_source "$n" "$w/kvlayout/backends/cuda/zeroer.py"
  stage_tests "$n"
  find "$w" -name __pycache__ -prune -exec rm -rf {} +
  local start=$SECONDS
  (cd "$w" && "$ROOT/$VENV/bin/mutmut" run --max-children "$JOBS" > mutmut-run.log 2>&1) \
    || { tail -40 "$w/mutmut-run.log"; return 1; }
  echo "$(( SECONDS - start ))" > "$w/seconds.txt"
  keep_results "$n"
}

rerun_survivors() {  # the last run's survivors only, against the current tests (sources unchanged)
  local n=$1 w="$WORK/$1"
  local f src
  for f in ${TARGETS[$n]}; do
    src=${f/kvlayout\/backends/backends}  # where the mutated file lives in the repository
    cp "$src" "$w/source.tmp" && stage_source "$n" "$w/source.tmp"
    cmp -s "$w/source.tmp" "$w/$f" || { echo "$src changed since the last full run of $n: run it in full" >&2; return 1; }
  done
  # KVLAYOUT_MUTATION_RERUN_TESTS: only these test files (the survivors already passed the others,
  # so when only these changed since the full run, the verdicts are the same, faster)
  [ -z "${KVLAYOUT_MUTATION_RERUN_TESTS:-}" ] || TESTS[$n]=$KVLAYOUT_MUTATION_RERUN_TESTS
  stage_tests "$n"
  mapfile -t left < <(grep -E ': (survived|no tests|suspicious)$' "$w/results.txt" | sed 's/^ *//; s/:.*//')
  local start=$SECONDS
  [ ${#left[@]} -eq 0 ] || (cd "$w" && "$ROOT/$VENV/bin/mutmut" run --max-children "$JOBS" "${left[@]}" \
    > mutmut-rerun.log 2>&1) || { tail -40 "$w/mutmut-rerun.log"; return 1; }
  echo "$(( $(cat "$w/seconds.txt") + SECONDS - start ))" > "$w/seconds.txt"
  keep_results "$n"
}

export JAX_PLATFORMS=cpu TPU_SKIP_MDS_QUERY=1 HYPOTHESIS_PROFILE=ci PYTHONDONTWRITEBYTECODE=1
# one OpenMP thread: mutmut forks a child per mutant from a process where torch may have started
# its OpenMP team, and libgomp in the child then waits forever at the team barrier (every mutant
# of vllm timed out so)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# KVLAYOUT_MUTATION_REPORT_ONLY=1: rebuild the table from the last run's results in $WORK
# KVLAYOUT_MUTATION_RERUN=1: rerun only the last run's survivors with the current tests (new tests can
# only kill more mutants; the sources must be those of the last full run)
if [ -n "${KVLAYOUT_MUTATION_REPORT_ONLY:-}" ]; then
  for n in "${names[@]}"; do keep_results "$n"; done  # e.g. after an interrupted survivor rerun
else
  mkdir -p "$WORK"
  for n in "${names[@]}"; do
    echo "== $n: ${TARGETS[$n]} with ${TESTS[$n]}"
    if [ -n "${KVLAYOUT_MUTATION_RERUN:-}" ]; then rerun_survivors "$n"; else run_one "$n"; fi
  done
fi
cd "$WORK"

# the table (bench/results/mutation.md, .json), merged with earlier runs of other modules
# (under a lock: runs of other modules in parallel merge into the same table)
flock "$ROOT/$OUT/.mutation.lock" "$TEST_VENV/bin/python" - "$ROOT" "$OUT" "$JOBS" "${names[@]}" <<'PY'
import json, pathlib, re, subprocess, sys, datetime
root, out, jobs, *names = sys.argv[1:]
secs = {k: int(pathlib.Path(k, "seconds.txt").read_text()) for k in names}
report_only = bool(__import__("os").environ.get("KVLAYOUT_MUTATION_REPORT_ONLY"))
out = pathlib.Path(root) / out
targets = {"spec": "kvlayout.spec", "planner": "kvlayout.planner", "table": "kvlayout.table",
           "verify": "kvlayout.verify", "reference": "kvlayout.reference", "validate": "kvlayout.validate",
           "ranges": "kvlayout.ranges", "cuda-plan": "kvlayout.backends.cuda.kernel",
           "pallas-plan": "kvlayout.backends.pallas.plan", "native": "kvlayout.native",
           "sharding": "kvlayout.sharding", "vllm": "kvlayout.integrations.vllm", "cli": "kvlayout.cli",
           "cuda-zeroer": "kvlayout.backends.cuda.zeroer", "pallas-zeroer": "kvlayout.backends.pallas.zeroer",
           "pallas-native": "kvlayout.backends.pallas.native", "models": "kvlayout.models",
           "models-mimo": "kvlayout.models.mimo_v2", "models-gemma4": "kvlayout.models.gemma4",
           "models-gemma3n": "kvlayout.models.gemma3n"}
KEYS = ["ranges", "spec", "planner", "table", "validate", "reference", "cuda-plan", "pallas-plan", "verify",
        "native", "sharding", "vllm", "cli", "cuda-zeroer", "pallas-zeroer", "pallas-native",
        "models", "models-mimo", "models-gemma4", "models-gemma3n"]

def in_target(key, mod):
    """A target is one module, or a package (models: every hand-written module in it)."""
    t = targets[key]
    own = (targets["models-mimo"], targets["models-gemma4"], targets["models-gemma3n"])  # their own targets
    return mod == t or (key == "models" and mod.startswith(t + ".") and mod not in own)

equiv = []  # (module, function, mutated line, reason)
# one file per group of targets (scripts/mutation_equivalent*.txt), so parallel work edits its own
eq_lines = [l for f in sorted((pathlib.Path(root) / "scripts").glob("mutation_equivalent*.txt"))
            for l in f.read_text().splitlines()]
for line in eq_lines:
    if line.strip() and not line.startswith("#"):
        mod, fn, rest = line.split(" | ", 2)  # the code may hold " | " itself: the reason is last
        code, why = rest.rsplit(" | ", 1)
        mod, fn, code, why = mod.strip(), fn.strip(), code.strip(), why.strip()
        equiv.append((mod, fn, code, why))

def parse(name):
    mod, _, rest = name.rpartition(".")
    fn = re.sub(r"__mutmut_\d+$", "", rest)
    fn = fn[2:] if fn.startswith("x\u01c1") else fn.removeprefix("x_")
    fn = fn.replace("\u01c1", ".").strip(".")
    return mod, fn

def added_lines(name, key):
    """The mutated lines ('+'), or for a pure deletion the deleted lines marked '-'."""
    p = pathlib.Path(key) / f"show.{name}.txt"
    text = p.read_text() if p.exists() else ""
    plus = [l[1:].strip() for l in text.splitlines() if l.startswith("+") and not l.startswith("+++")]
    minus = ["-" + l[1:].strip() for l in text.splitlines() if l.startswith("-") and not l.startswith("---")]
    return plus or minus

rows = {}
results = [(k, line) for k in names for line in (pathlib.Path(k) / "results.txt").read_text().splitlines()]
for key, line in results:
    if ":" not in line:
        continue
    name, status = (x.strip() for x in line.rsplit(":", 1))
    mod, fn = parse(name)
    if not in_target(key, mod):
        continue
    r = rows.setdefault(key, {"module": targets[key], "total": 0, "killed": 0, "survived": 0, "equivalent": 0,
                              "timeout": 0, "no_tests": 0, "other": 0, "survivors": [], "equivalents": []})
    r["total"] += 1
    if status in ("killed", "segfault"):  # a test run that crashes has detected the mutant too
        r["killed"] += 1
    elif status == "timeout":
        r["timeout"] += 1  # counted as killed in the score: the mutant never finished
    elif status in ("survived", "no tests", "suspicious"):
        code = added_lines(name, key)
        # an entry names the mutated line, or "mutant:<id>" where a line is ambiguous (ids are stable
        # while the source is unchanged: rerun in full and recheck these entries after a change)
        short = name.rpartition(".")[2]
        why = next((w for m, f, c, w in equiv if m == mod and f == fn and (c in code or c == f"mutant:{short}")),
                   None)
        entry = {"mutant": name, "function": fn, "status": status, "mutated": code[:3]}
        if why:
            r["equivalent"] += 1
            r["equivalents"].append(entry | {"reason": why})
        else:
            r["survived" if status != "no tests" else "no_tests"] += 1
            r["survivors"].append(entry)
    else:
        r["other"] += 1
path = out / "mutation.json"
old = json.loads(path.read_text()) if path.exists() else {"modules": {}}
old["modules"].update(rows)
old["runs"] = old.get("runs", []) + ([] if report_only else [{
    "date": datetime.date.today().isoformat(), "modules": names, "seconds": secs, "jobs": int(jobs),
    "test_scale": float(__import__("os").environ.get("KVLAYOUT_TEST_SCALE", "1")),
    "commit": subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True).stdout.strip(),
    "command": ("KVLAYOUT_MUTATION_RERUN=1 " if __import__("os").environ.get("KVLAYOUT_MUTATION_RERUN") else "")
    + (f"KVLAYOUT_MUTATION_RERUN_TESTS={__import__('os').environ['KVLAYOUT_MUTATION_RERUN_TESTS']} "
       if __import__("os").environ.get("KVLAYOUT_MUTATION_RERUN_TESTS") else "")
    + "scripts/mutation.sh " + " ".join(names), "tool": "mutmut 3.8.1"}])
path.write_text(json.dumps(old, indent=1) + "\n")
lines = ["# Mutation testing (issues 19, 25)", "",
         "`scripts/mutation.sh [MODULE ...]`: mutmut 3.8.1 over the core and the backends' host-side plans,",
         "fast subset of tests (`TESTS` in the script). Score = (killed + timeout) / (total - equivalent).",
         "Equivalent mutants and their reasons: `scripts/mutation_equivalent*.txt`.", "",
         "| module | mutants | killed | timeout | equivalent | survived | no tests | score |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
for key in KEYS:
    r = old["modules"].get(key)
    if not r:
        continue
    live = r["total"] - r["equivalent"]
    score = 100.0 * (r["killed"] + r["timeout"]) / live if live else 100.0
    lines.append(f"| {r['module']} | {r['total']} | {r['killed']} | {r['timeout']} | {r['equivalent']} | "
                 f"{r['survived']} | {r['no_tests']} | {score:.1f}% |")
lines += ["", "Each row comes from these runs (the last full run of the module, then survivor reruns):", ""]
for key in KEYS:
    mine = [x for x in old["runs"] if key in x["modules"]]
    full = [i for i, x in enumerate(mine) if "RERUN" not in x["command"]]
    mine = mine[full[-1]:] if full else mine
    if mine:
        lines.append(f"- {key}: " + "; ".join(f"{x['date']} {x['commit']} `{x['command']}`" for x in mine))
lines += ["", "Runs (seconds per module):"] + [
    f"- {x['date']} {x['commit']} `{x['command']}` {x['seconds']} on {x['jobs'] or '?'} cores" for x in old["runs"][-6:]] + [""]
left = [(k, s) for k, r in old["modules"].items() for s in r["survivors"]]
per_fn: dict = {}
for k, s in left:
    per_fn[(k, s["function"])] = per_fn.get((k, s["function"]), 0) + 1
if per_fn:
    lines += ["## Survivors per function", "", "| module | function | survivors |", "|---|---|---:|"]
    lines += [f"| {k} | `{f}` | {c} |" for (k, f), c in sorted(per_fn.items(), key=lambda x: -x[1])] + [""]
lines.append(f"## Surviving mutants ({len(left)})" if left else "## Surviving mutants: none")
for k, s in left:
    lines.append(f"- {k} `{s['function']}` ({s['status']}): `{' / '.join(s['mutated'])}`")
(out / "mutation.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines[:20]))
PY
}
main "$@"; exit  # on one line: bash reads no further, so editing this file mid-run is safe
