//! [`WithLockInfo`] for `http::Request`: the lock's info goes into the request's
//! extensions, and its route is named from what axum's router matched.

use crate::guard::LockInfo;
use crate::layer::request::WithLockInfo;

impl<B> WithLockInfo for http::Request<B> {
    fn set_lock_info(&mut self, info: LockInfo) {
        self.extensions_mut().insert(info);
    }

    fn route(&self) -> String {
        #[cfg(feature = "axum")]
        {
            let extensions = self.extensions();
            if let Some(matched) = extensions.get::<axum::extract::MatchedPath>() {
                return format!("{} {}", self.method(), matched.as_str());
            }
            if let Some(original) = extensions.get::<axum::extract::OriginalUri>() {
                return format!("{} {}", self.method(), original.path());
            }
        }
        format!("{} {}", self.method(), self.uri().path())
    }

    fn http_extensions(&mut self) -> Option<&mut http::Extensions> {
        Some(self.extensions_mut())
    }
}
