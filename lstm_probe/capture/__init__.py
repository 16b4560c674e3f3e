"""The capture layer: hooks on recurrent modules, what a framework tells them (the contract), the
states kept in device blocks and handed to the log layer. Knows no framework."""
