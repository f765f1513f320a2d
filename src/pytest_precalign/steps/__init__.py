"""What a training step did and is planned to do (see the package face commit)."""
