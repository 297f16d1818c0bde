"""Knowledge distillation: losses by name, layer maps, students, teacher-output cache, augmentation and
the distiller objective trained by the one :class:`~bertforge.engine.train.trainer.Trainer`."""
