"""The benchmark harness runs end to end: every implementation in its own worker process."""

import json
import subprocess
import sys

import pytest

from conftest import REPO

pytest.importorskip("transformers")  # the peer


def test_harness_times_plugin_and_peers_in_their_own_processes(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "bench_pretrain.py"), "--models",
         "electra_tiny", "--lengths", "32", "--batch-size", "4", "--vocab", "500",
         "--precisions", "fp32", "--steps", "2", "--warmup", "1", "--repeats", "2",
         "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = {r["impl"]: r for r in result["rows"]}
    assert set(rows) == {"plugin", "peer", "peer-retained"}
    plugin = rows["plugin"]
    for row in rows.values():
        assert len(row["ms_per_update_repeats"]) == 2 and row["tokens_per_s"] > 0
        assert row["peak_memory_bytes"] > 0 and row["page_faults_per_update"] >= 0
    # the ratios are the per-repeat time ratios of the rows they name
    for peer, key in (("peer", "vs_peer"), ("peer-retained", "vs_peer_retained")):
        ratios = sorted(b / a for a, b in zip(plugin["ms_per_update_repeats"],
                                              rows[peer]["ms_per_update_repeats"]))
        assert plugin[key] == pytest.approx(sum(ratios) / 2)
    # the peer projects every position onto the vocabulary, the plugin the masked ones
    assert rows["peer"]["executed_flops_per_update"] > plugin["executed_flops_per_update"]
    assert result["matmul_peak_flops"]["fp32"] > 0
    assert "electra_tiny T=32 B=4 fp32" in proc.stdout
