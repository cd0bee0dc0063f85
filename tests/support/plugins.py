"""Airflow's loaded plugins, forgotten the same way on every supported Airflow: 3.2 and later
cache them in functions (``_get_plugins()`` and friends), 3.1 keeps them in module globals."""

from __future__ import annotations

#: 3.1's module globals that hold what the plugins gave (None: not loaded yet).
_GLOBALS = ("plugins", "fastapi_apps", "fastapi_root_middlewares", "external_views", "react_apps", "menu_links",
            "flask_blueprints", "admin_views", "flask_appbuilder_views", "flask_appbuilder_menu_links")


def forget() -> None:
    """Make Airflow load the plugins again on next use."""
    from airflow import plugins_manager

    cached = [getattr(plugins_manager, name, None) for name in ("_get_plugins", "_get_ui_plugins",
                                                                "get_fastapi_plugins")]
    if all(c is not None for c in cached):
        for function in cached:
            function.cache_clear()  # type: ignore[union-attr]
        return
    for name in _GLOBALS:
        if hasattr(plugins_manager, name):
            setattr(plugins_manager, name, None)
    plugins_manager.import_errors.clear()
    plugins_manager.loaded_plugins.clear()
