"""Ray actors: one PolicyActor per card and one ReferenceActor on the CPU. They run, never judge."""
