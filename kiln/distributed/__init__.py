"""kiln under torch.distributed: graphs split at DistributedDataParallel's gradient buckets
(ddp_buckets)."""
