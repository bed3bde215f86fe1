"""Convert ELECTRA checkpoints between this fairseq plugin and Hugging Face transformers.

import: HF directories (config.json, model.safetensors or pytorch_model.bin, and vocab.txt or a
        WordPiece, Unigram (sentencepiece) or BPE tokenizer.json) -> OUT/checkpoint.pt,
        OUT/dict.txt, OUT/electra_tokenizer.json and OUT/vocab.txt or OUT/tokenizer.json
        (renumbered to the dictionary's order)
  electra-convert import --discriminator electra-small-discriminator \\
      [--generator electra-small-generator] --out imported/
  With --generator the checkpoint is for continued pre-training (--task electra); without
  it, the discriminator alone (ElectraForPreTraining, ElectraModel or
  ElectraForSequenceClassification) for fine-tuning.

export: a checkpoint -> OUT (discriminator: ElectraForPreTraining, ElectraModel or
        ElectraForSequenceClassification) and OUT/generator (ElectraForMaskedLM), each with
        config.json, model.safetensors and the transformers tokenizer files (vocab.txt for
        WordPiece; tokenizer.json in the model's own ids for sentencepiece)
  electra-convert export checkpoints/checkpoint_best.pt --out hf/ \\
      [--data data-bin/news] [--vocab vocab.txt] [--head NAME] [--force]

Both directions need transformers (pip install -e '.[hf]'). Errors (bad directories,
configs that do not fit, mismatched weights, a non-empty target) are reported in one line
and exit with status 1.
"""

import argparse
import sys

from electra_plugin.errors import command_line


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        prog="electra-convert", description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    sub = parser.add_subparsers(dest="command", required=True)

    imp = sub.add_parser("import", help="Hugging Face directories -> fairseq checkpoint")
    imp.add_argument("--discriminator", required=True,
                     help="HF directory of ElectraForPreTraining, ElectraModel or a "
                          "fine-tuned ElectraFor{Sequence,Token}Classification, "
                          "ElectraForQuestionAnswering or ElectraForMultipleChoice")
    imp.add_argument("--generator", default=None,
                     help="HF directory of ElectraForMaskedLM (makes a pre-training checkpoint)")
    imp.add_argument("--out", required=True, help="empty output directory")
    imp.add_argument("--head-name", default=None,
                     help="fairseq name for an imported head (default: the name its task "
                          "uses: sentence_classification_head, tagging or squad)")
    imp.add_argument("--force", "--overwrite", dest="overwrite", action="store_true",
                     help="replace the files of a previous import in --out")

    exp = sub.add_parser("export", help="fairseq checkpoint -> Hugging Face directories")
    exp.add_argument("checkpoint", help="checkpoint file of this plugin")
    exp.add_argument("--out", required=True, help="empty output directory")
    exp.add_argument("--data", default=None,
                     help="directory with the dict.txt the model was trained with "
                          "(default: the checkpoint's task.data)")
    exp.add_argument("--vocab", default=None,
                     help="WordPiece vocab.txt dict.txt was made from, if not next to dict.txt")
    exp.add_argument("--head", default=None,
                     help="classification head to export when the checkpoint has several")
    exp.add_argument("--force", "--overwrite", dest="overwrite", action="store_true",
                     help="replace the exported files already in --out")
    return parser.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    from electra_plugin.convert import from_hf, to_hf

    if args.command == "import":
        result = from_hf(args.discriminator, args.generator, out_dir=args.out,
                         head_name=args.head_name, overwrite=args.overwrite)
        print(f"wrote {result.checkpoint} (task {result.task}) and {result.dictionary}")
        if result.task == "electra":
            print(f"to prepare text with this checkpoint's tokenizer: electra-prepare --train "
                  f"TEXT --destdir DATA --tokenizer-from {args.out}")
            how = "continue pre-training"
            flags = "--task electra --criterion electra"
        else:
            how = "fine-tune"
            flags = "--task sentence_prediction ..."
        print(f"to {how}: fairseq-train DATA --user-dir electra_plugin {flags} "
              f"{' '.join(result.cli_args)} --restore-file {result.checkpoint} "
              f"--reset-optimizer --reset-dataloader --reset-meters")
    else:
        result = to_hf(args.checkpoint, args.out, overwrite=args.overwrite, data=args.data,
                       vocab=args.vocab, head=args.head)
        print(f"wrote {result.discriminator_dir} ({result.architecture})")
        if result.generator_dir:
            print(f"wrote {result.generator_dir} (ElectraForMaskedLM)")
        if not result.hf_tokenizer:
            print("note: no tokenizer description next to this dictionary, so no tokenizer "
                  "files; ids are fairseq dictionary ids (see VOCABULARY.md)")


def cli():
    """The console script: :func:`main` with its usage errors as one line."""
    sys.exit(command_line(main))


if __name__ == "__main__":
    cli()
