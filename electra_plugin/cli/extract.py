"""Writes the discriminator of a pre-training checkpoint as a checkpoint of its own.

After pre-training the generator is thrown away (ELECTRA, section 2). The result holds only
the discriminator encoder, no optimizer state, and loads with --restore-file /
--finetune-from-model into any fine-tuning task, the hub interface, or electra-convert.
Its task is fairseq's masked_lm, which reads the same dict.txt (+ <mask>) as the electra task.

Example:
  electra-extract --checkpoint checkpoints/checkpoint_best.pt --out disc.pt
"""


from electra_plugin.cli.command import console
from electra_plugin.cli.vocabulary import command_parser, positional_renamed, renamed

from electra_plugin.models.core.checkpoint import load_checkpoint, write_checkpoint
from electra_plugin.models.loading import FINETUNING_PARTS, fold_embedding_delta
from electra_plugin.user_io.errors import ElectraUsageError


def extract(checkpoint, out, overwrite=False):
    state = load_checkpoint(checkpoint)
    full = dict(state["model"])
    fold_embedding_delta(full)  # GDES: a plain discriminator holds one token embedding table
    model = {k: v for k, v in full.items() if k.startswith(FINETUNING_PARTS)}
    if len(model) == len(full):
        raise ElectraUsageError(f"{checkpoint} has no pre-training parts (generator, "
                                f"pre-training heads): it is already a discriminator-only "
                                f"checkpoint")
    task = state["cfg"]["task"]
    task_cfg = {"_name": "masked_lm", "data": task["data"],
                "tokens_per_sample": task.get("tokens_per_sample", 512)}
    path = write_checkpoint(out, state["cfg"]["model"], task_cfg, model, overwrite=overwrite)
    dropped = len(full) - len(model)
    print(f"wrote {path}: {len(model)} discriminator tensors ({dropped} pre-training-only "
          f"tensors dropped)")
    return path


def build_parser():
    p = command_parser("electra-extract", __doc__)
    p.add_argument("--checkpoint", required=True,
                   help="a pre-training checkpoint of the electra task")
    p.add_argument("--out", required=True, help="where to write the discriminator checkpoint")
    p.add_argument("--force", action="store_true", help="replace an existing --out file")
    positional_renamed(p, "--checkpoint")
    renamed(p, "--overwrite", "--force")
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    extract(args.checkpoint, args.out, args.force)


cli = console(main)


if __name__ == "__main__":
    cli()
