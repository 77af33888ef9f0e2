"""A new user's first requests: chat completions with the openai client's defaults.

    python scripts/default_chat.py --url http://127.0.0.1:8000

Sends each question once, as the openai client sends it when given nothing but
the model and the messages (no temperature, no max_tokens), and prints the wall
time, the tokens, how it finished and the answer; then the sampling the fleet
applied (from the job's record). Any OpenAI-compatible server takes the same
requests (the applied sampling is genfleet's own record).
"""

import argparse
import time

import httpx
from openai import OpenAI

QUESTIONS = (
    "What is the capital of France?",
    "Hello!",
    "Write a haiku about the sea.",
    "Explain what a CPU does in one sentence.",
    "Give me three tips for learning Python.",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the API's base URL")
    parser.add_argument("--api-key", default="unused")
    args = parser.parse_args()
    client = OpenAI(base_url=f"{args.url}/v1", api_key=args.api_key, max_retries=0, timeout=900)
    model = client.models.list().data[0].id
    print("| question | wall s | tokens | finish | answer |\n|---|---|---|---|---|")
    last_id = ""
    for question in QUESTIONS:
        started = time.monotonic()
        reply = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": question}]
        )
        wall = time.monotonic() - started
        choice = reply.choices[0]
        answer = (choice.message.content or "").strip().replace("\n", " ")
        tokens = reply.usage.completion_tokens if reply.usage else "?"
        print(f"| {question} | {wall:.2f} | {tokens} | {choice.finish_reason} | {answer} |")
        last_id = reply.id
    job = httpx.get(f"{args.url}/v1/jobs/{last_id}-0", timeout=10)
    if job.status_code == 200 and job.json().get("sampling"):
        applied = job.json()["sampling"]
        shown = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "max_tokens")
        print("\napplied:", ", ".join(f"{name}={applied[name]}" for name in shown))


if __name__ == "__main__":
    main()
