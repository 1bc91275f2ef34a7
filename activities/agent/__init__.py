"""What a node agent runs on its machine: its Temporal activities, engine processes (start, adopt,
watch, stop), discovery of the hardware, and the doctor's checks."""
