"""A plain agent loop: a model writes Python, runpython runs it in a sandbox, and the code calls the host's
own functions as tools. The model here is scripted (no network) and speaks the shape of Anthropic's
Messages API; with a real client, `ScriptedModel.create` is `client.messages.create`.

    python examples/agent_loop.py
"""

from __future__ import annotations

import json
from typing import Any

from runpython import RunPython

ORDERS: dict[str, dict[str, Any]] = {
    "A-17": {"customer": "ada", "total": 120.0, "items": ["kettle", "mugs"]},
    "B-02": {"customer": "alan", "total": 35.5, "items": ["teapot"]},
}
REFUNDS: list[dict[str, Any]] = []


def get_order(order_id: str) -> dict[str, Any]:
    """The order with this id: customer, total and items."""
    if order_id not in ORDERS:
        raise KeyError(f"no order {order_id}")
    return ORDERS[order_id]


def refund(order_id: str, amount: float, reason: str = "customer request") -> dict[str, Any]:
    """Refund part of an order; returns the refund record."""
    if amount > ORDERS[order_id]["total"]:
        raise ValueError(f"cannot refund {amount}: the order's total is {ORDERS[order_id]['total']}")
    record = {"order_id": order_id, "amount": amount, "reason": reason}
    REFUNDS.append(record)
    return record


class ScriptedModel:
    """Stands in for an LLM: the first turn writes code, the second reads its envelope and answers."""

    def __init__(self) -> None:
        self.turn = 0

    def create(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> dict[str, Any]:
        assert "run_python" in [t["name"] for t in tools]
        self.turn += 1
        if self.turn == 1:
            code = (
                "order = get_order(order_id)\n"
                "half = round(order['total'] / 2, 2)\n"
                "r = refund(order_id, half, reason='damaged kettle')\n"
                "print('refunded', r['amount'], 'to', order['customer'])\n"
                "r"
            )
            return {
                "stop_reason": "tool_use",
                "content": [
                    {"type": "text", "text": "I'll look the order up and refund half of it."},
                    {"type": "tool_use", "id": "call-1", "name": "run_python",
                     "input": {"code": code, "inputs": {"order_id": "A-17"}}},
                ],
            }
        envelope = json.loads(messages[-1]["content"][0]["content"])
        if envelope["status"] != "success":
            text = f"The refund failed: {envelope['error']['type']}: {envelope['error']['message']}"
        else:
            text = f"Done: {envelope['stdout'].strip()} (refund {envelope['return_value']['amount']})."
        return {"stop_reason": "end_turn", "content": [{"type": "text", "text": text}]}


def main() -> str:
    rp = RunPython(timeout=30, tools=[get_order, refund])
    model = ScriptedModel()
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Refund half of order A-17, the kettle broke."}]
    tools = rp.tool_spec("anthropic")  # 1. tell the model about run_python (and the host's functions)
    while True:
        reply = model.create(messages=messages, tools=tools)
        messages.append({"role": "assistant", "content": reply["content"]})
        calls = [block for block in reply["content"] if block["type"] == "tool_use"]
        if not calls:
            return "".join(block["text"] for block in reply["content"] if block["type"] == "text")
        results = []
        for call in calls:
            result = rp.handle_tool_call(call["name"], call["input"])  # 2. run what it wrote
            results.append({"type": "tool_result", "tool_use_id": call["id"], "content": json.dumps(result)})  # 3.
        messages.append({"role": "user", "content": results})


if __name__ == "__main__":
    answer = main()
    print(answer)
    assert REFUNDS == [{"order_id": "A-17", "amount": 60.0, "reason": "damaged kettle"}], REFUNDS
