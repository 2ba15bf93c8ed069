"""`create_tokenizer` (MNN's `Tokenizer::createTokenizer`): pick the format from the file head."""
from __future__ import annotations

import logging
import time

from mnnllm_core.errors import TokenizerError
from mnnllm_core.files import TOKENIZER_LIMIT, read_bounded

from .base import Tokenizer
from .bert import BertTokenizer
from .huggingface import HuggingfaceTokenizer
from .pipeline import PipelineTokenizer
from .reader import TokenizerType, read_header
from .sentencepiece import Sentencepiece
from .tiktoken import Tiktoken
from .tokenizer_json import JsonTokenizer

logger = logging.getLogger(__name__)

_TEXT_FORMATS = {
    TokenizerType.SENTENCEPIECE: Sentencepiece,
    TokenizerType.TIKTOKEN: Tiktoken,
    TokenizerType.BERT: BertTokenizer,
    TokenizerType.HUGGINGFACE: HuggingfaceTokenizer,
}


def create_tokenizer(path: str) -> Tokenizer:
    """Load any tokenizer MNN can: magic `430` + type 0-4, or a plain HF tokenizer.json."""
    start = time.perf_counter()
    path = str(path)
    data = read_bounded(path, TOKENIZER_LIMIT, TokenizerError, "tokenizer", field="path")
    if data.lstrip()[:1] == b"{":
        tokenizer: Tokenizer = JsonTokenizer.load(data, path)
    else:
        header = read_header(data, path)
        if header.type == TokenizerType.PIPELINE:
            tokenizer = PipelineTokenizer.load(data, header, path)
        else:
            tokenizer = _TEXT_FORMATS[header.type].load(data, header, path)
    logger.debug("loaded %s tokenizer %s (%d tokens) in %.3f s", type(tokenizer).__name__, path,
                 tokenizer.vocab_size, time.perf_counter() - start)
    return tokenizer
