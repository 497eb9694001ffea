"""seaweedfs HiCache storage backend: listed, not implemented in this build (see the reason)."""

from engine.api import Plugin

plugin = Plugin(
    name="seaweedfs",
    family="hicache_storage",
    implementation=None,
    description="one S3 object per KV page on a SeaweedFS S3 gateway",
    not_implemented="needs a SeaweedFS server with its S3 gateway ('weed server -s3', a Go binary) and boto3; not integrated yet",
)
