//! Replaying an observed history through the store's transitions (to be
//! written).
