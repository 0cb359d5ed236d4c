"""fused_bottleneck (placeholder until the kernel lands)."""
