"""``device="gpu"``: the device checks, the device read plan and its kvikio execution."""
