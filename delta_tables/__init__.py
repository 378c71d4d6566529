"""Every Delta table's schema, partitioning, properties and creation — the only place they are defined."""

from delta_tables.tables import TABLES, TableDef, create_all, ensure_tables, table_df, table_path

__all__ = ["TABLES", "TableDef", "create_all", "ensure_tables", "table_df", "table_path"]
