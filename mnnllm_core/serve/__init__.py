"""An OpenAI-compatible HTTP server for one loaded model, with a chat page (`mnnllm serve`):
`app` (routes), `worker` (the queue and the model's thread), `schemas` (the wire format),
`sampling` (request fields -> MNN sampler keys), `stops`, `server` (uvicorn, the CLI's entry).

Needs the `serve` extra (starlette, uvicorn, pydantic): `pip install 'mnnllm[serve]'`.
"""
