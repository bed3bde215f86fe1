"""ELECTRA checkpoints between this plugin and Hugging Face ``transformers``.

Tensor names, shapes and the vocabulary permutation come from :mod:`.keys`; :mod:`.hf_files`
reads and writes the HF directories (``config.json`` and the tokenizer files through
``transformers`` itself, the weights as ``model.safetensors``) and the plugin's checkpoint,
dictionary and tokenizer description.

Decisions:

* Both directions need ``transformers`` (the ``hf`` extra): it fills in the defaults of a
  ``config.json`` on import and writes ``config.json`` and the tokenizer files on export.
* Import reads ``model.safetensors`` or ``pytorch_model.bin`` (sharded or not) and stores
  fp32. The generator's output layer must be tied to its word embeddings (as in ELECTRA and
  in HF's ``ElectraForMaskedLM``). Generator and discriminator share the embedding block
  exactly when every embedding tensor of the two is equal; otherwise the checkpoint gets
  ``embedding_sharing=untied``. A generator shallower than the discriminator gets
  ``generator_layers`` (its depth as a fraction of the discriminator's).
* A GDES checkpoint (``--embedding-sharing gdes``) exports a plain discriminator: its token
  embeddings are the generator's plus the residual, folded into one table (the import of
  such an export gives ``embedding_sharing=untied``).
* Export needs the dictionary the model was trained with (``--data``, default: the
  checkpoint's ``task.data``). When the dictionary came from a WordPiece vocab.txt (found
  through ``electra_tokenizer.json``, as ``vocab.txt`` next to ``dict.txt``, or given
  explicitly) the HF rows follow that vocab.txt and the tokenizer is transformers'
  ``BertTokenizerFast``. A sentencepiece dictionary keeps fairseq's row order and gets a
  ``tokenizer.json`` in those ids (:mod:`electra_plugin.data.fast_tokenizer`) with
  ``<s> </s> <pad> <unk> <mask>`` as transformers' special tokens, next to ``dict.txt``
  and ``spm.model``. A dictionary imported from a non-WordPiece HF checkpoint exports in
  HF's ids with its original tokenizer files (kept by the import as ``hf_order.json`` and
  ``hf_tokenizer*.json``), so import then export gives the checkpoint back bit for bit.
  Only a dictionary with no tokenizer description exports without
  tokenizer files (a note, VOCABULARY.md, says how ids are numbered).
* A model without token types (``type_vocab_size=0``) is exported with one all-zero token
  type row, which HF adds to every token: the same numbers.
"""

from .hf_export import to_hf  # noqa: F401
from .hf_import import from_hf, model_cli_args  # noqa: F401
