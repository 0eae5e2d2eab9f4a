"""The OpenAI-compatible face of the playground: `POST /v1/chat/completions`,
`POST /v1/completions` and `GET /v1/models`, so that eval harnesses and notebooks that speak
the OpenAI API can sample and score a job's checkpoints (`names.py`: what the models are
called; `wire.py`: the chat wire format; `completions.py`: the legacy completions')."""
