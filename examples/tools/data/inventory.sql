-- The source of inventory.sqlite (rebuild: sqlite3 inventory.sqlite < inventory.sql).
CREATE TABLE items (id INTEGER PRIMARY KEY, name TEXT NOT NULL, stock INTEGER NOT NULL);
INSERT INTO items (name, stock) VALUES
  ('bolt', 1200), ('nut', 900), ('washer', 3100), ('hinge', 45), ('bracket', 310);
