"""Driving VLAs (FlashDrive): streaming KV reuse, reasoning drafter, trajectory head. Filled by the driving issue."""
