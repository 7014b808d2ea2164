"""The only tests that may take more than tests/cpu_budget.py's BUDGET_S of CPU time, each
with the reason it needs it: at most 25 entries. An entry is a test's node id without its
parametrization (it covers every parametrization) or with it (that one only).

Measured with SPEEDLIGHT_TEST_CPU_LOG on CI's kind of machine (2 cores); an entry is here
when a run gave it over about 12 s, so a slower machine does not fail it by the budget."""

SLOW: dict[str, str] = {
    "tests/report/test_report.py::test_report_runs_end_to_end_and_writes_every_stage":
        "pays for the session's report run, the main job end to end on the default model "
        "(profile, check, verify, bench, inspect, projection, plan: about 3 CPU-minutes), "
        "which every test of the module reads",
    "tests/distributed/test_training.py::test_every_rank_applies_rank_0s_plan":
        "pays for the module's spawned ranks (two processes importing torch, training a "
        "patched model with gloo) that every test of the module reads",
    "tests/distributed/test_dtensor.py::test_every_case_ran":
        "pays for the module's spawned ranks, which run every DTensor case the module's "
        "tests then read",
    "tests/patching/test_compile_cost.py::test_compiling_the_patched_model_costs_at_most_1_5x_the_original":
        "compiles the unpatched and the patched model with inductor, caches off: the two "
        "compile times are what it compares",
    "tests/patching/test_compile.py::test_forward_and_backward_compile_whole_and_match_eager":
        "AOT autograd traces a family's forward and backward in three input forms (rows, "
        "padded, packed) and runs them beside eager",
    "tests/patching/test_compile.py::test_dynamo_traces_every_family_in_one_graph_per_form":
        "dynamo traces a family's patched model in three input forms",
    "tests/patching/test_patch.py::test_twenty_training_steps_give_matching_loss_curves":
        "twenty training steps of the patched and the unpatched model under the interpreter",
    "tests/ops/test_contract.py::test_torch_compile_fullgraph":
        "inductor compiles an op between two others, forward and backward, with its caches "
        "off so the graphs reach the recorder (tests/compile_equal.py)",
    "tests/inspect/test_guards.py::test_kernels_compile_to_their_design":
        "compiles every block configuration of a memory-bound op for an arch (20-35 "
        "kernels, each through Triton, ptxas and nvdisasm)",
    "tests/inspect/test_gfx942.py::test_every_kernel_compiles_for_gfx942_to_its_design":
        "pays for the module's compile of every Triton kernel of the package for gfx942",
    "tests/inspect/test_every_kernel.py::test_default_case_compiles_every_kernel_to_its_design":
        "compiles every kernel of an op's default case at real size (moe_experts: ten "
        "large kernels)",
    "tests/inspect/test_findings.py::test_aligned_rows_compile_to_128_bit_accesses_and_no_finding":
        "pays for the module's compile batch of every memory-bound op's aligned cases",
    "tests/inspect/test_blackwell.py::test_matrix_kernels_meet_their_sm100a_design":
        "compiles attention's and the GEMMs' kernels for sm_100a (the largest kernels of "
        "the package, ptxas taking seconds each)",
    "tests/inspect/test_attention_design.py::test_attention_kernels_compile_to_their_design":
        "compiles attention's forward, backward and fault kernels for sm_90a",
    "tests/bench/test_gpu_check.py::test_gpu_check_on_cpu_with_a_tiny_suite":
        "runs scripts/gpu-check.sh whole on a CPU: its setup, verify and bench sections, "
        "each a process importing torch",
    "tests/shape/test_shape.py::test_inductor_kernels_read_by_inspect_against_hand_counts":
        "inductor compiles a researcher's op, then inspect compiles inductor's kernels for "
        "sm_90a",
    "tests/test_cluster.py::test_a_ray_verify_sweep_writes_the_rows_of_a_local_run_though_a_worker_died":
        "a local Ray cluster's workers (processes importing torch) verify a sweep, one "
        "worker killed twice and replaced",
    "tests/test_cluster.py::test_a_ray_bench_sweep_times_every_case_with_the_rows_of_a_local_run":
        "a local Ray cluster's workers time a bench sweep",
    "tests/test_cluster.py::test_a_ray_tune_sweep_writes_the_rows_of_a_local_run":
        "a local Ray cluster's workers compile and time a tune sweep",
}

assert len(SLOW) <= 25, "at most 25 slow tests"
