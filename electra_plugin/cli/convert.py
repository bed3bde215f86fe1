"""Convert ELECTRA checkpoints between this fairseq plugin and Hugging Face transformers.

Subcommands:
  import  HF directories (config.json, model.safetensors or pytorch_model.bin, and vocab.txt
          or a WordPiece, Unigram (sentencepiece) or BPE tokenizer.json) -> OUT_DIR/
          checkpoint.pt, dict.txt, electra_tokenizer.json and vocab.txt or tokenizer.json
          (renumbered to the dictionary's order). With --generator the checkpoint is for
          continued pre-training (--task electra); without it, the discriminator alone (or a
          fine-tuned ElectraFor... head) for fine-tuning.
  export  a checkpoint -> OUT_DIR (the discriminator: ElectraForPreTraining, ElectraModel or
          a fine-tuned head's class) and OUT_DIR/generator (ElectraForMaskedLM, or its
          body's), each with config.json, model.safetensors and the transformers tokenizer
          files (vocab.txt for WordPiece; tokenizer.json in the model's own ids for
          sentencepiece)

Both directions need transformers (pip install -e '.[hf]'). Errors (bad directories,
configs that do not fit, mismatched weights, a non-empty target) are reported in one line
and exit with status 1.

Examples:
  electra-convert import --discriminator electra-small-discriminator \\
      --generator electra-small-generator --out-dir imported/
  electra-convert export --checkpoint checkpoints/checkpoint_best.pt --out-dir hf/ \\
      [--pretrain-data data-bin/news] [--vocab vocab.txt] [--head NAME] [--force]
"""


from electra_plugin.cli.command import console
from electra_plugin.cli.vocabulary import (command_parser, positional_renamed, renamed,
                                           subcommand)


def build_parser():
    p = command_parser("electra-convert", __doc__)
    sub = p.add_subparsers(dest="command", required=True)

    imp = subcommand(sub, "import", "Hugging Face directories -> a fairseq checkpoint",
                     "  electra-convert import --discriminator electra-small-discriminator "
                     "--out-dir imported/")
    imp.add_argument("--discriminator", required=True,
                     help="HF directory of ElectraForPreTraining, ElectraModel or a "
                          "fine-tuned ElectraFor{Sequence,Token}Classification, "
                          "ElectraForQuestionAnswering or ElectraForMultipleChoice")
    imp.add_argument("--generator", default=None,
                     help="HF directory of ElectraForMaskedLM (makes a pre-training checkpoint)")
    imp.add_argument("--out-dir", required=True, help="empty output directory")
    imp.add_argument("--head", default=None,
                     help="fairseq name for an imported head (default: the name its task "
                          "uses: sentence_classification_head, tagging or squad)")
    imp.add_argument("--force", action="store_true",
                     help="replace the files of a previous import in --out-dir")
    for old, new in (("--out", "--out-dir"), ("--head-name", "--head"), ("--overwrite", "--force")):
        renamed(imp, old, new)

    exp = subcommand(sub, "export", "a fairseq checkpoint -> Hugging Face directories",
                     "  electra-convert export --checkpoint checkpoints/checkpoint_best.pt "
                     "--out-dir hf/")
    exp.add_argument("--checkpoint", required=True, help="a checkpoint of this plugin")
    exp.add_argument("--out-dir", required=True, help="empty output directory")
    exp.add_argument("--pretrain-data", default=None,
                     help="directory with the dict.txt the model was trained with "
                          "(default: the checkpoint's task.data)")
    exp.add_argument("--vocab", default=None,
                     help="WordPiece vocab.txt dict.txt was made from, if not next to dict.txt")
    exp.add_argument("--head", default=None,
                     help="classification head to export when the checkpoint has several")
    exp.add_argument("--force", action="store_true",
                     help="replace the exported files already in --out-dir")
    positional_renamed(exp, "--checkpoint")
    for old, new in (("--out", "--out-dir"), ("--data", "--pretrain-data"),
                     ("--overwrite", "--force")):
        renamed(exp, old, new)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    from electra_plugin.convert import from_hf, to_hf

    if args.command == "import":
        result = from_hf(args.discriminator, args.generator, out_dir=args.out_dir,
                         head_name=args.head, overwrite=args.force)
        print(f"wrote {result.checkpoint} (task {result.task}) and {result.dictionary}")
        if result.task == "electra":
            print(f"to prepare text with this checkpoint's tokenizer: electra-prepare --train "
                  f"TEXT --out-dir DATA --tokenizer-from {args.out_dir}")
            how = "continue pre-training"
            flags = "--task electra --criterion electra"
        else:
            how = "fine-tune"
            flags = "--task sentence_prediction ..."
        print(f"to {how}: fairseq-train DATA --user-dir electra_plugin {flags} "
              f"{' '.join(result.cli_args)} --restore-file {result.checkpoint} "
              f"--reset-optimizer --reset-dataloader --reset-meters")
    else:
        result = to_hf(args.checkpoint, args.out_dir, overwrite=args.force,
                       data=args.pretrain_data, vocab=args.vocab, head=args.head)
        print(f"wrote {result.discriminator_dir} ({result.architecture})")
        if result.generator_dir:
            print(f"wrote {result.generator_dir} ({result.generator_architecture})")
        if not result.hf_tokenizer:
            print("note: no tokenizer description next to this dictionary, so no tokenizer "
                  "files; ids are fairseq dictionary ids (see VOCABULARY.md)")


cli = console(main)


if __name__ == "__main__":
    cli()
