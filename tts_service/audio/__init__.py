"""Audio in and out of the service, shared by both front doors: reference recordings decoded to 24 kHz mono
(`reference`), and the model's audio encoded to the formats clients ask for (`output`)."""
