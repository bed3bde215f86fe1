"""The benchmark harness runs end to end: every row in its own worker process, the plugin's
rows set up from the command lines users type for each precision."""

import json
import sys

import pytest

from helpers import REPO, run

pytest.importorskip("transformers")  # the peer


@pytest.mark.slow
def test_harness_times_plugin_command_lines_and_peers_in_their_own_processes(tmp_path):
    out = tmp_path / "bench.json"
    proc = run(
        [sys.executable, str(REPO / "benchmarks" / "bench_pretrain.py"), "--models",
         "electra_tiny", "--lengths", "32", "--batch-size", "4", "--vocab", "500",
         "--precisions", "fp32", "bf16", "--steps", "2", "--warmup", "1", "--repeats", "2",
         "--threads", "1", "--data-batch-size", "8", "--data-batches", "2",
         "--json", str(out)],
        cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = {(r["precision"], r["impl"]): r for r in result["rows"]}
    assert set(rows) == {("fp32", "plugin fp32"), ("fp32", "peer"), ("fp32", "peer-retained"),
                         ("bf16", "plugin --autocast-bf16"),
                         ("bf16", "plugin --bf16 (electra-train)"), ("bf16", "peer"),
                         ("bf16", "peer-retained")}
    # each plugin row ran the flags its name says
    assert rows["bf16", "plugin --autocast-bf16"]["flags"] == ["--autocast-bf16"]
    assert rows["bf16", "plugin --bf16 (electra-train)"]["flags"] == ["--bf16"]
    assert rows["fp32", "plugin fp32"]["flags"] == []
    for row in rows.values():
        assert len(row["ms_per_update_repeats"]) == 2 and row["tokens_per_s"] > 0
        assert row["peak_memory_bytes"] > 0 and row["page_faults_per_update"] >= 0
        # each row's first repeat is printed as soon as it is warm (a cut run keeps it)
        first = f"{row['config']} {row['impl']}: {row['ms_per_update_repeats'][0]:.1f} ms/update"
        assert first in proc.stdout
    # the ratios are the per-repeat time ratios against the peers of the same precision
    for (precision, impl), plugin in rows.items():
        if not impl.startswith("plugin"):
            continue
        for peer, key in (("peer", "vs_peer"), ("peer-retained", "vs_peer_retained")):
            ratios = sorted(b / a for a, b in zip(
                plugin["ms_per_update_repeats"],
                rows[precision, peer]["ms_per_update_repeats"]))
            assert plugin[key] == pytest.approx(sum(ratios) / 2)
    # the peer projects every position onto the vocabulary, the plugin the masked ones
    plugin = rows["fp32", "plugin fp32"]
    assert rows["fp32", "peer"]["executed_flops_per_update"] > \
        plugin["executed_flops_per_update"]
    # the data rows: one loader worker's masked sequences/s, both maskings
    data = {r["masking"]: r for r in result["data"]}
    assert set(data) == {"", "--whole-word-mask"}
    for row in data.values():
        assert row["impl"] == "plugin" and row["batch_size"] == 8 and row["length"] == 32
        assert row["sequences_per_s"] == pytest.approx(8e3 / row["ms_per_batch"])
        assert len(row["ms_per_batch_repeats"]) == 2
        assert f"data electra_tiny T=32 B=8 plugin {row['masking']}".strip() in proc.stdout
    assert set(result["matmul_peak_flops"]) == {"fp32", "bf16"}
    assert all(v > 0 for v in result["matmul_peak_flops"].values())
    assert "electra_tiny T=32 B=4 bf16" in proc.stdout
    # the CPU's bf16 units are reported, and the advice names the faster precision
    machine = result["machine"]
    assert set(machine["bf16_units"]) <= {"amx_bf16", "avx512_bf16"}
    assert "CPU bf16 matrix units: " in proc.stdout
    bf16 = max(rows["bf16", "plugin --autocast-bf16"]["tokens_per_s"],
               rows["bf16", "plugin --bf16 (electra-train)"]["tokens_per_s"])
    (advice,) = result["advice"]
    assert advice in proc.stdout
    if bf16 < plugin["tokens_per_s"]:
        assert advice.startswith("advice: ") and "train in fp32" in advice
    else:
        assert "bf16 pays here" in advice


def test_the_peer_and_the_flops_take_the_plugins_model_options():
    """``--plugin-args`` shapes the plugin's rows; its model options shape the peer and the
    FLOPs too (a tiny plugin against a full-size peer would be no comparison), and what is
    not a model option is left to fairseq."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    import bench_pretrain

    options = ["--num-layers", "2", "--hidden-size", "16", "--num-heads", "4",
               "--generator-size", "0.25", "--clip-norm", "1", "--autocast-bf16"]
    disc, gen = bench_pretrain.model_sizes(bench_pretrain.arch_config("electra_base", options))
    assert (disc.layers, disc.hidden, disc.heads, gen.hidden) == (2, 16, 4, 4)
    full, _ = bench_pretrain.model_sizes(bench_pretrain.arch_config("electra_base"))
    assert (full.layers, full.hidden) == (12, 768)
