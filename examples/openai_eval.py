"""An eval harness's OpenAI-compatible chat backend, in a dozen lines: prompts go to an OPD
service's `/v1/chat/completions` through the official `openai` package, one model at a
time, and each answer comes back with its tokens' logprobs and its usage.

    OPD_API_KEY=$(cat .opd/api-key) python examples/openai_eval.py job-12 job-12:teacher
"""

from __future__ import annotations

import argparse
import os

from openai import OpenAI

PROMPTS = ["What is 2 + 3?", "Compute 7 * 8.", "Is 17 a prime number?", "Solve x + 4 = 9."]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="job-N, job-N@step-S, job-N:teacher, ...")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    client = OpenAI(base_url=args.base_url, api_key=os.environ["OPD_API_KEY"])
    for model in args.models:
        for prompt in PROMPTS:
            answer = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": prompt}],
                max_tokens=args.max_tokens,
                temperature=0,
                logprobs=True,
            )
            choice = answer.choices[0]
            logprobs = [token.logprob for token in choice.logprobs.content]
            mean = sum(logprobs) / len(logprobs)
            print(
                f"{model:<16} {prompt!r:<24} {answer.usage.completion_tokens:>3} tokens, "
                f"mean logprob {mean:6.3f}, {choice.finish_reason:<6} {choice.message.content!r}"
            )


if __name__ == "__main__":
    main()
