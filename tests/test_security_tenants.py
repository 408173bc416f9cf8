"""The timing side channel inside one namespace, and its remedy (issue 15, item 11).

Within one namespace a prompt someone else already sent restores from checkpoints (fast);
an unseen one is computed (slow): the time to first token tells whether another user sent it.
One namespace per tenant closes the channel: block keys are salted by the namespace, so a
tenant never restores, and so never times, another tenant's checkpoints, even in one store."""

from conftest import load_tiny
from forkv.engine import Engine, SamplingParams

PROMPT = list(range(5, 5 + 600))  # two full 256-token blocks and a tail
ONE = SamplingParams(max_tokens=1)


def test_one_namespace_per_tenant_shares_no_checkpoints():
    lm = load_tiny("qwen3")
    alice = Engine(lm, namespace="tenant-alice")
    bob = Engine(lm, store=alice.store, namespace="tenant-bob")  # same process, same store
    try:
        assert alice.generate(PROMPT, ONE).timings.reused_tokens == 0
        assert alice.generate(PROMPT, ONE).timings.reused_tokens == 512  # the channel
        assert bob.generate(PROMPT, ONE).timings.reused_tokens == 0  # closed across tenants
        assert bob.generate(PROMPT, ONE).timings.reused_tokens == 512  # bob's own reuse stays
    finally:
        bob.close()
        alice.close()
