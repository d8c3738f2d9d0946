//! Exports: named devices that front-ends serve.
//!
//! An [`ExportPlan`] is what the settings ask for (a backend spec and the
//! stage specs stacked on it); [`build_exports`] opens the backends and
//! stacks the stages, giving one [`Export`] per plan. Every front-end
//! (NBD, FUSE, ...) receives the same `Arc<Export>`s, so all of them reach
//! the same device and see the same bytes.

use crate::block::DevRef;
use anyhow::{Context, Result};
use std::sync::Arc;

/// One named device, shared by every front-end that serves it.
pub struct Export {
    /// The name clients ask for ("" is the default export).
    pub name: String,
    /// The top of the stack: stages over the backend.
    pub dev: DevRef,
    /// Refuse writes, because the settings ask so or the device is
    /// read-only.
    pub read_only: bool,
    /// A one-line description (NBD sends it as NBD_INFO_DESCRIPTION).
    pub description: String,
}

impl Export {
    /// "default export" or `export "NAME"`, for messages.
    pub fn label(&self) -> String {
        label(&self.name)
    }
}

impl std::fmt::Debug for Export {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Export")
            .field("name", &self.name)
            .field("dev", &self.dev.name())
            .field("read_only", &self.read_only)
            .finish()
    }
}

fn label(name: &str) -> String {
    if name.is_empty() {
        "default export".to_string()
    } else {
        format!("export {name:?}")
    }
}

/// One export to build: name, backend spec, stage specs (first = top).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportPlan {
    pub name: String,
    pub backend: String,
    pub stages: Vec<String>,
    pub read_only: bool,
    /// Defaults to the device's name.
    pub description: Option<String>,
}

impl ExportPlan {
    /// Opens the backend and stacks the stages.
    pub fn build(&self) -> Result<Export> {
        let what = label(&self.name);
        let backend = crate::backend::open(&self.backend).with_context(|| what.clone())?;
        let dev = crate::stage::build_stack(&self.stages, backend).with_context(|| what.clone())?;
        let read_only = self.read_only || dev.info().read_only;
        let description = self.description.clone().unwrap_or_else(|| dev.name());
        Ok(Export {
            name: self.name.clone(),
            dev,
            read_only,
            description,
        })
    }
}

/// Opens every plan's backend and stacks its stages, in order.
pub fn build_exports(plans: &[ExportPlan]) -> Result<Vec<Arc<Export>>> {
    plans.iter().map(|p| p.build().map(Arc::new)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_opens_backend_and_stacks_stages() {
        let plans = vec![
            ExportPlan {
                name: String::new(),
                backend: "memory:1M".into(),
                stages: vec!["stats".into()],
                read_only: false,
                description: None,
            },
            ExportPlan {
                name: "b".into(),
                backend: "null:2M".into(),
                stages: vec![],
                read_only: true,
                description: Some("scratch".into()),
            },
        ];
        let ex = build_exports(&plans).unwrap();
        assert_eq!(ex.len(), 2);
        assert_eq!(ex[0].dev.info().size, 1 << 20);
        assert!(!ex[0].read_only);
        assert_eq!(ex[0].description, ex[0].dev.name());
        assert_eq!(ex[0].label(), "default export");
        assert_eq!(ex[1].name, "b");
        assert!(ex[1].read_only);
        assert_eq!(ex[1].description, "scratch");
        assert_eq!(ex[1].label(), "export \"b\"");
        let bad = ExportPlan {
            name: "z".into(),
            backend: "nosuch:1M".into(),
            ..plans[0].clone()
        };
        let e = format!("{:#}", build_exports(&[bad]).unwrap_err());
        assert!(e.contains("export \"z\""), "{e}");
    }
}
