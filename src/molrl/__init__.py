"""molrl: MoL-RL for real models: multi-step feedback traces, MoL continual training,
GRPO / Dr.GRPO with execution rewards, and feedback-independent evaluation."""

__version__ = "0.1.0"
