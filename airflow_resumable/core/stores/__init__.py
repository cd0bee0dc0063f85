"""Checkpoint stores: SQLite (embedded default) and PostgreSQL."""

from airflow_resumable.core.stores.base import SCHEMA_VERSION, Store, StoreSession
from airflow_resumable.core.stores.postgres import PostgresStore
from airflow_resumable.core.stores.sqlite import SQLiteStore

__all__ = ["SCHEMA_VERSION", "PostgresStore", "SQLiteStore", "Store", "StoreSession"]
