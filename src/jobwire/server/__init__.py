"""asyncio adapters: one per listener, thin between codecs and the engine."""
