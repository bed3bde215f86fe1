"""An electra_adam update keeps fairseq's checks on the device until --log-interval
(electra_plugin/speed/deferred.py): no host sync inside an update of fairseq-train, the same
training and logs as with fairseq's per-update checks, the same divergence lines."""

import logging

import pytest
import torch
from fairseq.trainer import Trainer

from electra_plugin.profiling.host_work import HostWork
from electra_plugin.speed.switch import VARIABLE
from helpers import assert_usage_line, checkpoint, records, train_cmd, train_in_process

pytestmark = pytest.mark.slow


def electra_adam_run(data, save, *extra):
    cmd = train_cmd(data, save, "--disable-validation", "--no-epoch-checkpoints", *extra)
    cmd[cmd.index("--optimizer") + 1] = "electra_adam"
    return cmd


def with_log_interval(cmd, interval):
    cmd = list(cmd)
    cmd[cmd.index("--log-interval") + 1] = str(interval)
    return cmd


def logged(cmd, caplog):
    """Train in process -> the train_inner records of its log."""
    caplog.set_level(logging.INFO)
    caplog.clear()
    train_in_process(cmd)
    return records("\n".join(f"| {r.name} | {r.getMessage()}" for r in caplog.records))


def test_no_host_sync_inside_an_update_between_log_intervals(data_bin, tmp_path,
                                                             monkeypatch):
    """Every train_step of a real fairseq-train run counted: no sync in any update that does
    not end a log interval, also where the run may skip non-finite updates (their lr picked
    on the device); with fairseq's checks (ELECTRA_SPEED=-deferred) every update has them,
    so the count sees what it looks for."""
    original = Trainer.train_step

    def syncs_per_update(switch, *extra):
        counts = []

        def counted(trainer, samples, *args, **kwargs):
            with HostWork(where=True) as work:
                output = original(trainer, samples, *args, **kwargs)
            counts.append((trainer.get_num_updates(), dict(work.sync_sites)))
            return output

        monkeypatch.setattr(Trainer, "train_step", counted)
        monkeypatch.setenv(VARIABLE, switch)
        train_in_process(with_log_interval(electra_adam_run(
            data_bin, tmp_path / f"{switch}{len(extra)}", "--max-update", "8", "--no-save",
            *extra), 4))
        assert [update for update, _ in counts] == list(range(1, 9))
        return counts

    for extra in ((), ("--skip-nonfinite-updates", "2")):
        assert [(update, sites) for update, sites in syncs_per_update("1", *extra)
                if update % 4 and sites] == []
    assert all(any("isfinite" in site for site in sites)
               for _, sites in syncs_per_update("-deferred"))


def test_the_same_run_and_logs_as_with_fairseqs_checks(data_bin, tmp_path, caplog,
                                                       monkeypatch):
    """Losses, grad norms and weights equal (up to the weight decay's rounding) with the
    checks deferred and with fairseq's per-update checks (ELECTRA_SPEED=-deferred), logged
    every 3 updates."""
    def run(name, switch):
        monkeypatch.setenv(VARIABLE, switch)
        cmd = with_log_interval(electra_adam_run(data_bin, tmp_path / name, "--max-update",
                                                 "6", "--weight-decay", "0.01",
                                                 "--clip-norm", "1.0"), 3)
        return logged(cmd, caplog), checkpoint(tmp_path / name / "checkpoint_last.pt")

    deferred, deferred_ck = run("deferred", "1")
    plain, plain_ck = run("plain", "-deferred")
    assert [r["num_updates"] for r in deferred] == [r["num_updates"] for r in plain] == [3, 6]
    timed = {"wps", "ups", "wpb", "bsz", "wall", "train_wall", "gb_free"}
    for a, b in zip(deferred, plain):
        assert set(a) == set(b)
        assert {"loss", "disc_loss", "gen_loss", "gnorm", "disc_acc", "lr"} <= set(a)
        for key in set(a) - timed:
            assert a[key] == pytest.approx(b[key], rel=1e-3, abs=1e-3), key
    for name, tensor in plain_ck["model"].items():
        assert torch.allclose(deferred_ck["model"][name].float(), tensor.float(), atol=1e-5), name
    for speed in ("ups", "wps"):  # timed from the first update, not from the interval's read
        assert deferred[0][speed] < 5 * max(plain[0][speed], deferred[1][speed]), speed


@pytest.mark.parametrize("interval", [1, 5])
def test_divergence_stops_at_its_update_whatever_the_log_interval(data_bin, tmp_path,
                                                                  caplog, interval):
    """lr 1e30: the run stops with the line naming the first non-finite update, the same as
    fairseq's check finds at once, and every checkpoint it saved is finite."""
    cmd = electra_adam_run(data_bin, tmp_path / f"ck{interval}", "--max-update", "20",
                           "--save-interval-updates", "1")
    cmd[cmd.index("--lr") + 1] = "1e30"
    cmd = with_log_interval(cmd, interval)
    caplog.set_level(logging.INFO)
    with pytest.raises(Exception) as caught:
        train_in_process(cmd)
    line = assert_usage_line(caught.value, "training diverged at update 3: its gradients are "
                                           "NaN/Inf", "the last finite loss was",
                             "at update 2")
    assert "were saved before it and are intact" in line
    for path in (tmp_path / f"ck{interval}").glob("*.pt"):
        for name, tensor in checkpoint(path)["model"].items():
            assert torch.isfinite(tensor.float()).all(), (path.name, name)


def test_nonfinite_updates_are_skipped_as_fairseqs_are(data_bin, tmp_path, caplog):
    """--skip-nonfinite-updates 2 at lr 1e30 with log interval 1: updates 3 and 3 again are
    skipped (taken back from the count), the third stops the run at update 3."""
    cmd = electra_adam_run(data_bin, tmp_path / "ck", "--max-update", "20",
                           "--skip-nonfinite-updates", "2")
    cmd[cmd.index("--lr") + 1] = "1e30"
    caplog.set_level(logging.INFO)
    caplog.clear()
    with pytest.raises(Exception) as caught:
        train_in_process(cmd)
    log = "\n".join(r.getMessage() for r in caplog.records)
    skipped = [line for line in log.splitlines() if "skipped update" in line]
    assert len(skipped) == 2 and all("skipped update 3:" in line for line in skipped), skipped
    assert_usage_line(caught.value, "training diverged at update 3")


WATCHED = "discriminator.encoder.layer.0.intermediate.dense.weight"  # decayed, every update


def adam_move(before, after, state, group):
    """An Adam update's move of a parameter read back as (lr, lr x the bias corrections'
    step size): fairseq's ``p -= lr * wd * p + lr * c(t) * m / (sqrt(v) + eps)`` fitted to
    the move by least squares, m and v as the update left them."""
    moved = (before - after).double().flatten()
    adam = (state["exp_avg"] / (state["exp_avg_sq"].sqrt() + group["eps"])).double().flatten()
    parts = torch.stack([before.double().flatten(), adam], 1)
    decay, step = torch.linalg.lstsq(parts, moved[:, None]).solution.flatten().tolist()
    return decay / group["weight_decay"], step


def test_after_a_skipped_update_the_lr_follows_fairseqs_schedule(data_bin, tmp_path,
                                                                  monkeypatch):
    """NaN gradients at the third update, skipped (--skip-nonfinite-updates 1) on the device
    and read at the run's end (--log-interval 100): each update moves the weights at the lr
    and Adam step of fairseq's count, as with fairseq's checks (ELECTRA_SPEED=-deferred),
    which take the skip back at once. The lr climbs 1/20 of --lr a step (warm-up), so one
    step ahead on the schedule is a move a third too large."""
    original = Trainer.train_step

    def moves(switch):
        found = []
        poison = {"on": False}

        def observed(trainer, samples, *args, **kwargs):
            param = dict(trainer.get_model().named_parameters())[WATCHED]
            if not found:
                param.register_hook(lambda g: g * float("nan") if poison["on"] else g)
            poison["on"] = len(found) == 2
            before = param.detach().clone()
            output = original(trainer, samples, *args, **kwargs)
            poison["on"] = False
            adam = trainer.optimizer.optimizer
            group = next(g for g in adam.param_groups if any(p is param for p in g["params"]))
            found.append(adam_move(before, param.detach(), adam.state[param], group))
            return output

        monkeypatch.setattr(Trainer, "train_step", observed)
        monkeypatch.setenv(VARIABLE, switch)
        train_in_process(with_log_interval(electra_adam_run(
            data_bin, tmp_path / switch, "--max-update", "8", "--no-save", "--weight-decay",
            "0.1", "--warmup-updates", "20", "--total-num-update", "40",
            "--skip-nonfinite-updates", "1"), 100))
        return found

    deferred, plain = moves("1"), moves("-deferred")
    assert len(deferred) == 8 and len(plain) == 9  # the skipped call counted, or taken back
    assert deferred[2] == plain[2] == (0.0, 0.0)  # the skipped update moved nothing
    lrs = [lr for lr, _ in plain[:8]]
    assert lrs[0] == 0.0 and all(b > 1.1 * a for a, b in zip(lrs[3:], lrs[4:])), lrs
    for update, (ours, theirs) in enumerate(zip(deferred, plain), 1):
        assert ours == pytest.approx(theirs, rel=1e-3, abs=1e-12), (update, deferred, plain)
