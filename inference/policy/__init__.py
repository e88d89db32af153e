"""Fleet decisions as pure functions: where adapter versions live and which node serves a request.

Everything here takes frozen snapshots and returns decisions; nothing reads the database, the network or the clock
(the caller passes ``now_s``), so the gateway, the workers, the unit tests and ``./scripts/simulate`` run the same
code (docs/architecture.md, "Decisions are pure").

- ``tiers``: residency words (GPU slot, engine CPU cache, node disk, S3 only, errored) and the DB's names for them.
- ``hrw``: rendezvous (highest-random-weight) hashing.
- ``routing``: score eligible nodes for one request.
- ``placement``: which nodes should hold each version (HRW with bounded load, ``k`` growing with request rate).
- ``eviction``: which residents leave a tier to make room (LRU, LFU with decay, cost-aware), pins bounded.
- ``engine_model``: vLLM's two LoRA LRUs as a state machine (what the engine does when nobody chooses for it).
"""
