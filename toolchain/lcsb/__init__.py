"""lcsb stage."""
