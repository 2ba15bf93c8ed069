"""`mnnllm export`: HF safetensors folders and GGUF files -> MNN-LLM model directories, with numpy only."""
from .default_model import ensure_default_model
from .exporter import ARCHITECTURES, ExportReport, export_model, write_model

__all__ = ["ARCHITECTURES", "ExportReport", "ensure_default_model", "export_model", "write_model"]
