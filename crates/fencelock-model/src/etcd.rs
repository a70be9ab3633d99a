//! The etcd lock recipe as a stateright model (to be written).
